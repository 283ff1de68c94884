"""``popart.SessionOptions``: every field with PopART's default.

Fields that change what openpop does are listed in ``EFFECTIVE``; every other field is accepted,
kept and reported, and changes nothing on CPUs/GPUs (engine and report options, tile and IO
settings, outlining, patterns, caching hints...). docs/guides/popart.md lists them.
"""
from . import messages
from .enums import (
    CommGroupType,
    MeanReductionStrategy,
    MergeVarUpdateType,
    RecomputationType,
    ReductionType,
    ReplicatedTensorSharding,
    SyntheticDataMode,
    TensorStorage,
    TileSet,
    VirtualGraphMode,
)
from .errors import popart_exception


class _Settings:
    """A plain attribute bag for PopART's nested settings structs."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class ExecutionPhaseSettings(_Settings):
    def __init__(self, phases=0, stages=2, weightIOSchedule=0, activationIOSchedule=0,
                 optimizerStateIOSchedule=0, accumulatorIOSchedule=0, schedule=0):
        super().__init__(phases=phases, stages=stages, weightIOSchedule=weightIOSchedule,
                         activationIOSchedule=activationIOSchedule, optimizerStateIOSchedule=optimizerStateIOSchedule,
                         accumulatorIOSchedule=accumulatorIOSchedule, schedule=schedule)


class AccumulateOuterFragmentSettings(_Settings):
    def __init__(self, schedule=0, excludedVirtualGraphs=None):
        super().__init__(schedule=schedule, excludedVirtualGraphs=list(excludedVirtualGraphs or []))


class BatchSerializationSettings(_Settings):
    def __init__(self, factor=0, concatOnVirtualGraphChange=True, concatOnExecutionPhaseChange=True,
                 concatOnPipelineStageChange=True, transformContext=0, method=0, batchSchedule=0):
        super().__init__(factor=factor, concatOnVirtualGraphChange=concatOnVirtualGraphChange,
                         concatOnExecutionPhaseChange=concatOnExecutionPhaseChange,
                         concatOnPipelineStageChange=concatOnPipelineStageChange, transformContext=transformContext,
                         method=method, batchSchedule=batchSchedule)


class AutomaticLossScalingSettings(_Settings):
    def __init__(self, enabled=False, binEdgeLocation=0.125, thresholdUpperCountProportion=1e-7, updatePeriod=1,
                 toTrackTensors=None, gradientTensorTrackingMethod=0):
        super().__init__(enabled=enabled, binEdgeLocation=binEdgeLocation,
                         thresholdUpperCountProportion=thresholdUpperCountProportion, updatePeriod=updatePeriod,
                         toTrackTensors=toTrackTensors, gradientTensorTrackingMethod=gradientTensorTrackingMethod)


class CommGroup(_Settings):
    """A group of replicas a collective or a sharded tensor spans (PopART's ``CommGroup``)."""

    def __init__(self, type=CommGroupType.All, replicaGroupSize=0):
        super().__init__(type=CommGroupType(type), replicaGroupSize=int(replicaGroupSize))


class TensorLocation(_Settings):
    """Where a tensor is stored on an IPU system: ``TensorLocation(storage)``,
    ``TensorLocation(storage, replicatedTensorSharding[, shardingDomain])`` or
    ``TensorLocation(storage, loadTileSet, storageTileSet, replicatedTensorSharding[, shardingDomain])``,
    as in PopART. Memory placement: accepted and kept, no effect on CPUs/GPUs."""

    def __init__(self, storage=TensorStorage.OnChip, *args, **kwargs):
        with_tile_sets = len(args) > 2 or (bool(args) and isinstance(args[0], TileSet))
        names = (("loadTileSet", "storageTileSet", "replicatedTensorSharding", "shardingDomain") if with_tile_sets
                 else ("replicatedTensorSharding", "shardingDomain"))
        fields = dict(storage=TensorStorage(storage), loadTileSet=TileSet.Compute,
                      storageTileSet=TileSet.Compute, replicatedTensorSharding=ReplicatedTensorSharding.Off,
                      shardingDomain=CommGroup())
        fields.update(zip(names, args))
        fields.update(kwargs)
        super().__init__(**fields)


class ExperimentalSettings(_Settings):
    """PopART's experimental settings. Accepted and kept; no effect on CPUs/GPUs."""

    def __init__(self):
        super().__init__(createHostTransferableTensorWithOffset=False, _customTransformApplierSettings={})


class NumIOTiles(int):
    """A number of IO tiles (``NumIOTiles(n)``): IPU tile layout, no effect on CPUs/GPUs."""


class TensorLocationSettings(_Settings):
    def __init__(self, location=None, minElementsForOffChip=2, minElementsForReplicatedTensorSharding=8192):
        super().__init__(location=location, minElementsForOffChip=minElementsForOffChip,
                         minElementsForReplicatedTensorSharding=minElementsForReplicatedTensorSharding)


def _defaults():
    return {
        # -- fields with an effect on openpop
        "enablePipelining": False,
        "virtualGraphMode": VirtualGraphMode.Off,
        "virtualGraphSplitRatios": [],
        "enableReplicatedGraphs": False,
        "replicatedGraphCount": 1,
        "enableDistributedReplicatedGraphs": False,
        "globalReplicationFactor": 1,
        "globalReplicaOffset": 0,
        "enableGradientAccumulation": False,
        "accumulationFactor": 1,
        "accumulationAndReplicationReductionType": ReductionType.Sum,
        "meanAccumulationAndReplicationReductionStrategy": MeanReductionStrategy.Post,
        "autoRecomputation": RecomputationType.NoRecompute,
        "explicitRecomputation": False,
        "enableStochasticRounding": False,
        "constantWeights": True,
        "syntheticDataMode": SyntheticDataMode.Off,
        "enableLoadAndOffloadRNGState": False,
        # -- accepted; no effect on CPUs/GPUs
        "engineOptions": {},
        "reportOptions": {},
        "convolutionOptions": {},
        "lstmOptions": {},
        "matmulOptions": {},
        "gclOptions": {},
        "tensorLocationSettingsOverride": {},
        "enableOutlining": True,
        "enableOutliningCopyCostPruning": True,
        "outlineThreshold": 1.0,
        "outlineSequenceBreakCost": 10000.0,
        "enableFullyConnectedPass": True,
        "enableGroupedMatmuls": False,
        "enableSerializedMatmuls": True,
        "enableStableNorm": False,
        "enableFloatingPointChecks": False,
        "enablePrefetchDatastreams": True,
        "defaultPrefetchBufferingDepth": 1,
        "prefetchBufferingDepthMap": {},
        "rearrangeAnchorsOnHost": True,
        "rearrangeStreamsOnHost": False,
        "enableNonStableSoftmax": False,
        "enableEngineCaching": False,
        "enableVariablesCaching": True,
        "cachePath": "session_cache",
        "logDir": "",
        "exportPoplarComputationGraph": False,
        "exportPoplarVertexGraph": False,
        "instrumentWithHardwareCycleCounter": False,
        "hardwareInstrumentations": set(),
        "disableGradAccumulationTensorStreams": False,
        "disableOptimizerStateTensorStreams": False,
        "compileEngine": True,
        "opxAliasChecking": False,
        "opxModifyChecking": False,
        "dotChecks": set(),
        "customCodelets": [],
        "customCodeletCompileFlags": "",
        "kahnTieBreaker": "greedy",
        "swapLimitScheduler": 900000,
        "transitiveClosureOptimizationThreshold": 100000,
        "decomposeGradSum": False,
        "mergeVarUpdate": MergeVarUpdateType.Off,
        "mergeVarUpdateMemThreshold": 1000000,
        "looseThresholdAtPeak": 8000,
        "scheduleNonWeightUpdateGradientConsumersEarly": False,
        "enableExplicitMainLoops": False,
        "useHostCopyOps": False,
        "aliasZeroCopy": False,
        "delayVarUpdates": True,
        "batchSerializationSettings": BatchSerializationSettings(),
        "executionPhaseSettings": ExecutionPhaseSettings(),
        "accumulateOuterFragmentSettings": AccumulateOuterFragmentSettings(),
        "automaticLossScalingSettings": AutomaticLossScalingSettings(),
        "activationTensorLocationSettings": TensorLocationSettings(),
        "weightTensorLocationSettings": TensorLocationSettings(),
        "optimizerStateTensorLocationSettings": TensorLocationSettings(),
        "accumulatorTensorLocationSettings": TensorLocationSettings(),
        "numIOTiles": 0,
        "groupHostSync": False,
        "strictOpVersions": True,
        "separateCallOpPdfs": True,
        "finalDotOp": 4,
        "firstDotOp": 0,
        "serializedPoprithmsShiftGraphsDir": "",
        "partialsTypeMatMuls": "",
        "timeLimitScheduler": 1e9,
        "enableInplaceAmbiguityChecking": True,
        "createImplicitPipeliningFwdOnlyProgram": False,
        "throwIfLog2ScaleTensorNotInRange": True,
        "enableSupportedDataTypeCasting": True,
        "ensureFp32LossScaleTensor": False,
        "replicatedCollectivesSettings": _Settings(prepareScheduleForMergingCollectives=False,
                                                   mergeAllReduceCollectives=False),
        "autodiffSettings": _Settings(stitchStrategy=0),
        "developerSettings": _Settings(),
        "subgraphCopyingStrategy": 0,
        "executionPhaseSchedule": 0,
        "useLoopCandidateCreator": False,
        "stashAllTensorsInferencePipeline": False,
        "bufferingDepth": 1,
        "updatableNamedBuffers": [],
        "enableMergeExchange": True,
        "enableDistributedReplicatedGraphsOnly": False,
        "bufferingDepthMap": {},
        "defaultBufferingDepth": 1,
        "dotOpNames": False,
        "enableConstantFoldingOfMultipleConsumers": True,
        "enableEfficientOverlapIOTopoCons": False,
        "experimentalSettings": ExperimentalSettings(),
        "groupNormStridedChannelGrouping": False,
        "serializedPoprithmsAnnealGraphsDir": "",
        "enableRngStateManagement": False,
        "saveInitializersToFile": "",  # PopTorch passes it to PopART as a string option
    }


# PopART's bindings name these fields with a leading underscore; openpop keeps one value for both.
_UNDERSCORED = {"_engineOptions": "engineOptions", "_reportOptions": "reportOptions",
                "_convolutionOptions": "convolutionOptions", "_lstmOptions": "lstmOptions",
                "_matmulOptions": "matmulOptions", "_gclOptions": "gclOptions",
                "_tensorLocationSettingsOverride": "tensorLocationSettingsOverride",
                "_enableRngStateManagement": "enableRngStateManagement"}


EFFECTIVE = ("enablePipelining", "virtualGraphMode", "virtualGraphSplitRatios", "enableReplicatedGraphs",
             "replicatedGraphCount", "enableDistributedReplicatedGraphs", "globalReplicationFactor",
             "globalReplicaOffset", "enableGradientAccumulation", "accumulationFactor",
             "accumulationAndReplicationReductionType", "meanAccumulationAndReplicationReductionStrategy",
             "autoRecomputation", "explicitRecomputation", "enableStochasticRounding", "constantWeights",
             "syntheticDataMode")


class SessionOptions:
    """Every PopART session option as a read/write attribute with its default."""

    def __init__(self):
        object.__setattr__(self, "_values", _defaults())

    def __getattr__(self, name):
        values = object.__getattribute__(self, "_values")
        name = _UNDERSCORED.get(name, name)
        if name in values:
            return values[name]
        raise AttributeError(messages.SESSION_OPTIONS_NO_ATTRIBUTE.format(name=name))

    def __setattr__(self, name, value):
        values = object.__getattribute__(self, "_values")
        name = _UNDERSCORED.get(name, name)
        if name not in values:
            raise AttributeError(messages.SESSION_OPTIONS_NO_ATTRIBUTE.format(name=name))
        values[name] = value

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | set(self._values))

    def enableExplicitIR(self, enable: bool) -> None:
        self.enableExplicitMainLoops = bool(enable)
        self.useHostCopyOps = bool(enable)
        self.explicitRecomputation = bool(enable)

    def getGlobalReplicationFactor(self) -> int:
        if self.enableDistributedReplicatedGraphs:
            return int(self.globalReplicationFactor)
        if self.enableReplicatedGraphs:
            return int(self.replicatedGraphCount)
        return 1

    def getAccumulationFactor(self) -> int:
        if int(self.accumulationFactor) > 1 and not self.enableGradientAccumulation:
            raise popart_exception(messages.ACCUMULATION_FACTOR_WITHOUT_ACCUMULATION)
        return int(self.accumulationFactor) if self.enableGradientAccumulation else 1

    def local_replicas(self) -> int:
        return int(self.replicatedGraphCount) if self.enableReplicatedGraphs else 1

    def explicitly_changed(self):
        defaults = _defaults()
        return {k: v for k, v in self._values.items() if k in defaults and _differs(v, defaults[k])}

    def __repr__(self):
        return "SessionOptions(" + ", ".join(f"{k}={v!r}" for k, v in self.explicitly_changed().items()) + ")"


def _differs(a, b) -> bool:
    try:
        return bool(a != b)
    except Exception:
        return True
