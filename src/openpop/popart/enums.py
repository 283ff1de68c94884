"""PopART's enumerations, with the numbering of PopART's Python bindings."""
import enum

# The same enumerations as PopTorch's (one definition, same numbering as PopART's).
from ..enums import MeanReductionStrategy, ReductionType  # noqa: F401


class AnchorReturnTypeId(enum.IntEnum):
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3


class VirtualGraphMode(enum.IntEnum):
    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


class RecomputationType(enum.IntEnum):
    NoRecompute = 0
    Standard = 1
    NormOnly = 2
    Pipeline = 3
    RecomputeAll = 4


class RecomputeType(enum.IntEnum):
    Undefined = 0
    Checkpoint = 1
    Recompute = 2
    Recomputed = 3


class SyncPattern(enum.IntEnum):
    """How IPUs synchronise with each other and the host. Accepted for compatibility; CPUs and
    GPUs have no such pattern, so it changes nothing here."""
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class DeviceConnectionType(enum.IntEnum):
    Always = 0
    OnDemand = 1
    Never = 2


class DeviceSelectionCriterion(enum.IntEnum):
    First = 0
    Random = 1


class DeviceType(enum.IntEnum):
    IpuModel = 0
    Cpu = 1
    Ipu = 2
    OfflineIpu = 3
    Sim = 4


class SyntheticDataMode(enum.IntEnum):
    Off = 0
    Zeros = 1
    RandomNormal = 2
    RandomUniform = 3


class AdamMode(enum.IntEnum):
    Adam = 0
    AdamNoBias = 1
    AdaMax = 2
    Lamb = 3
    LambNoBias = 4


class WeightDecayMode(enum.IntEnum):
    Decay = 0
    L2Regularization = 1


class SGDAccumulatorAndMomentum(enum.IntEnum):
    Combined = 0
    Separate = 1


class AdaptiveMode(enum.IntEnum):
    AdaGrad = 0
    RMSProp = 1
    CenteredRMSProp = 2
    AdaDelta = 3


class InitType(enum.IntEnum):
    NoInit = 0
    Zero = 1


class ReplicatedStreamMode(enum.IntEnum):
    Broadcast = 0
    Replicate = 1


class ExecutionPhaseSchedule(enum.IntEnum):
    Interleaving = 0
    Batch = 1
    BatchClusteredIO = 2


class CollectiveOperator(enum.IntEnum):
    Add = 0
    Mean = 1
    Mul = 2
    Min = 3
    Max = 4
    LogicalAnd = 5
    LogicalOr = 6
    SquareAdd = 7
    Local = 8


class CommGroupType(enum.IntEnum):
    All = 0
    Consecutive = 1
    Orthogonal = 2
    Ungrouped = 3


class MergeVarUpdateType(enum.IntEnum):
    Off = 0
    All = 1
    AutoLoose = 2
    AutoTight = 3


class TileSet(enum.IntEnum):
    Compute = 0
    IO = 1


class ExchangeStrategy(enum.IntEnum):
    JustInTime = 0
    OverlapInnerLoop = 1
    OverlapLoops = 2
    OverlapStep = 3


class PatternsLevel(enum.IntEnum):
    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


class DotCheck(enum.IntEnum):
    Fwd0 = 0
    Fwd1 = 1
    Bwd0 = 2
    PreAlias = 3
    Final = 4


class MatMulSerialisationMode(str, enum.Enum):
    NoSerialisation = "none"
    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"


class TensorRemapType(enum.IntEnum):
    """Which passes a tensor remap applies to (IPU tile layout)."""
    FwdBwdReverse = 0
    FwdBwd = 1
    Fwd = 2


class ScatterReduction(enum.IntEnum):
    """The reduction of ``scatterreduce``."""
    Sum = 0
    Max = 1
    Min = 2
    Mul = 3
    NoReduction = 4


class GradientTensorTrackingMethod(enum.IntEnum):
    """Which gradients automatic loss scaling tracks."""
    AllNonViewChangingGradientTensors = 0
    ConvAndMatmulGradients = 1
    GradientsOfUserSpecifiedTensors = 2


class BatchSerializationTransformContext(enum.IntEnum):
    """Which pass batch serialisation applies to (``Fwd``/``Bwd`` are aliases)."""
    Forward = 0
    Fwd = 0
    Backward = 1
    Bwd = 1


class BatchSerializationMethod(enum.IntEnum):
    """How batch serialisation is unrolled. Accepted; no effect on CPUs/GPUs."""
    UnrollDynamic = 0
    UnrollStatic = 1
    Loop = 2


class BatchSerializationBatchSchedule(enum.IntEnum):
    """The schedule of batch-serialised parts. Accepted; no effect on CPUs/GPUs."""
    Scheduler = 0
    Isomorphic = 1
    OverlapOnIo = 2
    OverlapOnCompute = 3


class AutodiffStitchStrategy(enum.IntEnum):
    """How autodiff stitches forward values into backward graphs (PopART IR)."""
    RecomputeMinimal = 0
    RecomputeAllNonInputs = 1
    AddFwdOutputs = 2
    SafeAddFwdOutputs = 3


class SubgraphCopyingStrategy(enum.IntEnum):
    """When PopART copies subgraph inputs and outputs. Accepted; no effect on CPUs/GPUs."""
    OnEnterAndExit = 0
    JustInTime = 1


class TensorStorage(enum.IntEnum):
    """Where a tensor lives on an IPU system (on chip or streaming memory). Accepted; no effect on CPUs/GPUs."""
    OnChip = 0
    OffChip = 1


class ReplicatedTensorSharding(enum.IntEnum):
    """Whether a tensor is sharded over replicas (IPU memory saving). Accepted; no effect on CPUs/GPUs."""
    Off = 0
    On = 1


class ExecutionPhaseIOSchedule(enum.IntEnum):
    """When phased execution loads tensors. Accepted; no effect on CPUs/GPUs."""
    Preload = 0
    OnDemand = 1


class AccumulateOuterFragmentSchedule(enum.IntEnum):
    """How the optimizer step after gradient accumulation is scheduled over IPUs. Accepted; no effect on CPUs/GPUs."""
    Scheduler = 0
    Serial = 1
    OverlapCycleOptimized = 2
    OverlapMemoryOptimized = 3


class IrSerializationFormat(enum.IntEnum):
    """The format of ``Session.getSerializedGraph``-style IR dumps."""
    JSON = 0


class Instrumentation(enum.IntEnum):
    """Cycle-count instrumentation points. Accepted; no effect on CPUs/GPUs."""
    Outer = 0
    Inner = 1


class VariableRetrievalMode(enum.IntEnum):
    """How grouped variables are read back from replicas."""
    OnePerGroup = 0
    AllReduceReplicas = 1
    AllReplicas = 2


class RecoveryAction(enum.IntEnum):
    """Poplar's recovery actions after a device error. IPU hardware only."""
    IPU_RESET = 0
    LINK_RESET = 1
    PARTITION_RESET = 2
    FULL_RESET = 3


class DataType(enum.IntEnum):
    """``popart.DataType`` (PopART's datatype.hpp order). Builder methods and TensorInfo take it where
    they take a type name ("FLOAT"); the ONNX model stores ONNX's own type numbers."""
    UINT8 = 0
    INT8 = 1
    FLOAT8_143 = 2
    FLOAT8_152 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    UINT32 = 8
    UINT64 = 9
    BOOL = 10
    FLOAT = 11
    FLOAT16 = 12
    BFLOAT16 = 13
    DOUBLE = 14
    COMPLEX64 = 15
    COMPLEX128 = 16
    STRING = 17
    UNDEFINED = 18
