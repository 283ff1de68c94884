"""The texts of PopART's errors and warnings (PopART's exact words where it had them), raised by name;
a raise or warning site fills in the ``{fields}`` with ``.format``."""


# --- builder.py --------------------------------------------------------------------------------
EXPECTED_AN_ONNX_MODEL_BYTES_A = "Expected an ONNX model (bytes, a file name or a ModelProto), got {model_type}"
BUILDER_OBJECT_HAS_NO_ATTRIBUTE = "'Builder' object has no attribute '{name}'"
INVALID_OPSET_SELECTED_OPSET_FOR_DOMAIN = (
    "Invalid opset '{label}{version}' selected. Opset for domain {domain} already defined as {current}"
)
ADD_INPUT_UNEXPECTED_ARGUMENTS = "addInputTensor(): unexpected arguments {kwargs}"
ADD_INPUT_NEEDS_INFO_OR_TYPE_AND_SHAPE = "addInputTensor() needs a TensorInfo or a data type and a shape"
TENSOR_UNKNOWN_TO_BUILDER = "Tensor '{tensor_id}' is not known to this builder"
NOT_A_SUBGRAPH_BUILDER = (
    "addInputTensorFromParentGraph: this builder is not a subgraph builder"
)
TENSOR_UNKNOWN_TO_PARENT = "Tensor '{tensorId}' is not known to the parent graph"
SHAPE_OF_TENSOR_COULD_NOT_BE = "Shape of tensor '{tensor_id}' could not be inferred"
NO_PRODUCER = "Could not find a node that produces tensor '{tensor_id}'"
VIRTUAL_GRAPH_NOT_SET = "Virtual graph not set"
PIPELINE_STAGE_NOT_SET = "Pipeline stage not set"
EXECUTION_PHASE_NOT_SET = "Execution phase not set"
NODE_HAS_NO_ATTRIBUTE = "Node has no attribute '{attributeName}'"
ADD_INPUT_SHAPE_MISSING = "addInputTensor(dtype, shape): the shape is missing"
NO_PRODUCER_TO_ANNOTATE = "Could not find a node that produces tensor '{tensor_id}' to set {attr} on"
FAILED_TO_PARSE_THE_ONNX_MODEL = "Failed to parse the ONNX model: {exc}"
MODEL_FILE_MISSING = "Failed to load an ONNX model from '{model}': no such file"
MODEL_LOAD_FAILED = "Failed to load an ONNX model from '{model}': {exc}"
ADD_INPUT_UNEXPECTED_ARGUMENT = "addInputTensor(): unexpected argument {extra!r}"
ADD_INITIALIZED_INPUT_UNEXPECTED_ARGUMENT = "addInitializedInputTensor(): unexpected argument {extra!r}"

# --- dataflow.py -------------------------------------------------------------------------------
INVALID_ANCHOR_RETURN_TYPE_ID_SUPPLIED = "Invalid anchor return type ID supplied: {artString}"
BATCHESPERSTEP_MUST_BE_AT_LEAST_GOT = "batchesPerStep must be at least 1, got {batchesPerStep}"
TENSOR_IS_NOT_ANCHORED = "Tensor '{anchorId}' is not anchored"
MUST_SPECIFY_RETURN_PERIOD_WITH_OPTION = "Must specify return period with option 'EVERYN'"
ANCHOR_RETURN_PERIOD_MUST_BE_GREATER = "Anchor return period must be greater than zero"
A_RETURN_PERIOD_SHOULD_NOT_BE = "A return period should not be supplied for this anchor return type ({artString})"
DATAFLOW_GIVE_EITHER_A_DICT_OF = "DataFlow: give either a dict of return types or a list of ids with anchorReturnType"
ANCHOR_EXPECTED_A_POPART_ANCHORRETURNTYPE_GOT = "Anchor '{tensor_id}': expected a popart.AnchorReturnType, got {art!r}"
RETURN_PERIOD_MUST_BE_LESS_THAN = (
    "Return period must be less than or equal to batches per step. Anchor '{tensor_id}': return period {rp}, "
    "batches per step {bps}"
)
BATCHES_PER_STEP_MUST_BE_A = (
    "Batches per step must be a multiple of return period. Anchor '{tensor_id}': return period {rp}, batches per "
    "step {bps}"
)

# --- devices.py --------------------------------------------------------------------------------
CANNOT_ATTACH_TO_AN_OFFLINE_IPU = "Cannot attach to an offline IPU device"
INVALID_VALUE_FOR_DEVICE_OPTION = "Invalid value '{value}' for device option '{key}'"
ALL_DEVICES_ATTACHED = "Failed to acquire device with {numIpus} IPUs: all are attached"
NO_SUCH_DEVICE_ID = "Failed to acquire device with id '{device_id}': no such device"
NOT_ENOUGH_IPUS = (
    "Failed to acquire device with {numIpus} IPUs. Ensure that there are sufficient IPUs available (openpop "
    "offers {pool_size}, in power-of-two groups)"
)
DEVICE_ID_ATTACHED = "Failed to acquire device with id '{device_id}': it is attached"

# --- distributed.py ----------------------------------------------------------------------------
GLOBAL_REPLICATION_NOT_A_MULTIPLE = (
    "globalReplicationFactor ({total}) must be a multiple of the local replication factor ({local})"
)
GLOBAL_REPLICA_OFFSET_NOT_A_MULTIPLE = (
    "globalReplicaOffset ({offset}) must be a multiple of the local replication factor ({local}) below "
    "globalReplicationFactor ({total})"
)
DISTRIBUTED_NEEDS_POPRUN = (
    "enableDistributedReplicatedGraphs with globalReplicationFactor {total} needs {local} processes: launch the "
    "program with `poprun --num-instances {local} --num-replicas {total} ...`"
)
DISTRIBUTED_INITIALISES_POPDIST = (
    "enableDistributedReplicatedGraphs: initialising popdist for this session. In a future release, this will no "
    "longer be done automatically: call popdist.init() before creating the session."
)

# --- graph.py ----------------------------------------------------------------------------------
CALL_NODE_THE_CALLEE_TAKES_INPUTS = "call node '{node_name}': the callee takes {n_names} inputs, got {n_inputs}"
INPUT_TENSOR_HAS_NO_COMPLETE_SHAPE = (
    "Input tensor '{tensor_id}' has no complete shape in the model; give its shape with popart.InputShapeInfo"
)
INPUT_TENSOR_IS_PRODUCED_BY_NO = (
    "{node}: input tensor '{missing}' is produced by no node, input or initializer of the model (or the graph "
    "has a cycle)"
)
TENSOR_IS_NOT_PRODUCED_BY_THE = "Tensor '{missing}' is not produced by the model"
TENSOR_IS_USED_BY_A_PIPELINE = (
    "Tensor '{missing}' is used by a pipeline stage / virtual graph before the stage that produces it"
)

# --- ops/common.py -----------------------------------------------------------------------------
A_SHAPE_LIKE_INPUT_IS_NOT = "a shape-like input is not a constant"

# --- ops/control.py ----------------------------------------------------------------------------
NODE_THE_BODY_GRAPH_TAKES_INPUTS = (
    "{op_type} node '{node_name}': the body graph '{name}' takes {n_names} inputs, got {n_inputs}"
)
SCAN_NODE_OPSET_S_SCAN_WITH = (
    "Scan node '{node_name}': opset {opset}'s Scan (with a batch axis and sequence_lens) is not supported; use "
    "ai.onnx opset 9 or later"
)
SCAN_NODE_THE_SCAN_INPUTS_HAVE = (
    "Scan node '{node_name}': the scan inputs have different lengths {xs} along their scan axes"
)
LOOP_NODE_RAN_A_MILLION_ITERATIONS = (
    "Loop node '{node_name}' ran a million iterations without its condition turning false"
)
LOOP_NODE_RAN_NO_ITERATION_ITS = "Loop node '{node_name}' ran no iteration: its scan outputs have no shape"

# --- opsets.py ---------------------------------------------------------------------------------
OPSET_HAS_NO_OPERATOR = "'{label}' opset {version} has no operator '{name}'"
IS_AN_AI_ONNX_OPERATOR = "{op_type} is an ai.onnx operator"
CALL_IS_AN_AI_GRAPHCORE_OPERATOR = "call is an ai.graphcore operator"
TOO_MANY_POSITIONAL_ARGUMENTS_EXPECTED_THEN = (
    "{op_type}: too many positional arguments ({n_pos}); expected {positional} then debugContext"
)

# --- optimizers.py -----------------------------------------------------------------------------
GRADIENT_CLIPPING_OF_A_SUBSET_OF = (
    "Gradient clipping of a subset of the weights is not supported by openpop; use "
    "ClipNormSettings.clipAllWeights"
)
OPTIMIZER_VALUES_ARE_VALUE_ISCONST_PAIRS = "Optimizer values are (value, isConst) pairs, got {v!r}"
UNKNOWN_OPTIMIZER_PARAMETER_FOR_VALID = "Unknown optimizer parameter '{unknown}' for {self_type}; valid: {keys}"
INSERTSPECIFIC_IS_NOT_A_TRAINABLE_WEIGHT = "insertSpecific: '{unknown}' is not a trainable weight of the model"
UPDATED_OPTIMIZER_TYPE_DIFFERS = (
    "updateOptimizerFromHost: the new optimizer ({new_type}) must be of the type the session was built with "
    "({self_type})"
)
ADAM_NO_BIAS_L2_UNSUPPORTED = "AdamNoBias with L2Regularization is not supported by openpop"
ADAPTIVE_PER_WEIGHT_VALUES_ARE_NOT = "Adaptive: per-weight values are not supported by openpop"
CLIP_NORM_SETTINGS_MUST_BE_POPART = "clip_norm_settings must be popart.ClipNormSettings objects"
INVALID_WEIGHT_SPECIFIC_PARAMETER = "Invalid weight-specific optimizer parameter '{k}' for {weightId}"
CONSTANT_OPTIMIZER_VALUE_CHANGED = (
    "updateOptimizerFromHost: '{name}'{of_weight} is constant ({value}) and cannot be changed"
)
GRADIENT_CLIPPING_IS_NOT_SUPPORTED_WITH = "Gradient clipping is not supported with Lamb by openpop"
ADAMAX_WITH_DECOUPLED_WEIGHT_DECAY_IS = (
    "AdaMax with decoupled weight decay is not supported by openpop; use WeightDecayMode.L2Regularization"
)

# --- options.py --------------------------------------------------------------------------------
SESSION_OPTIONS_NO_ATTRIBUTE = "'popart.SessionOptions' object has no attribute '{name}'"
ACCUMULATION_FACTOR_WITHOUT_ACCUMULATION = (
    "enableGradientAccumulation is false, but accumulationFactor > 1. Either enable gradient accumulation, or "
    "set the accumulation factor to 1"
)

# --- placement.py ------------------------------------------------------------------------------
SPLIT_RATIOS_COUNT_MISMATCH = (
    "virtualGraphSplitRatios has {n_ratios} entries for {ipus} IPUs per replica"
)

# --- sessions.py -------------------------------------------------------------------------------
CONNECT_STREAM_TO_CALLBACK_UNSUPPORTED = (
    "connectStreamToCallback is not supported by openpop; use PyStepIOCallback"
)
BUFFER_FOR_HAS_ELEMENTS_EXPECTED = "Buffer for '{name}' has {size} elements, expected {size2}"
DATAFLOW_MUST_BE_A_POPART_DATAFLOW = "dataFlow must be a popart.DataFlow, got {dataFlow_type}"
NO_DEVICE_GIVEN_DEVICEINFO_IS_NONE = "No device given (deviceInfo is None): acquire one with popart.DeviceManager()"
DEVICEINFO_MUST_BE_A_POPART_DEVICEINFO = "deviceInfo must be a popart.DeviceInfo, got {deviceInfo_type}"
USEROPTIONS_MUST_BE_A_POPART_SESSIONOPTIONS = "userOptions must be a popart.SessionOptions, got {options_type}"
REPLICATEDGRAPHCOUNT_MUST_BE_AT_LEAST = "replicatedGraphCount must be at least 1"
GRADIENT_ACCUMULATION_IS_ONLY_AVAILABLE_IN = "Gradient accumulation is only available in training sessions"
CANNOT_RUN_ON_AN_OFFLINE_IPU = "Cannot run on an offline IPU device: it only compiles"
RESET_HOST_WEIGHTS_WITH_CONSTANT_WEIGHTS = (
    "Cannot call resetHostWeights when constantWeights is set: set SessionOptions.constantWeights = False"
)
NO_TENSOR_IN_THE_MODEL = "No tensor '{id}' in the model"
LOSS_MUST_BE_A_TENSOR_ID = "loss must be a tensor id (str), got {loss_type}"
THE_LOSS_TENSOR_IS_NOT_A = "The loss tensor '{loss}' is not a tensor of the model"
OPTIMIZER_MUST_BE_A_POPART_OPTIMIZER = (
    "optimizer must be a popart optimizer (SGD, ConstSGD, Adam, Adaptive), got {optimizer_type}"
)
THE_NUMBER_OF_IPUS_REQUESTED_MUST = (
    "The number of IPUs requested ({numIpus}) must be a multiple of replicatedGraphCount ({replicationFactor})"
)
THE_MODEL_NEEDS_IPUS_VIRTUAL_GRAPHS = (
    "The model needs {needed} IPUs ({ipus_per_replica} virtual graphs x {replicationFactor} replicas) but the "
    "device has {numIpus}"
)
READWEIGHTS_IS_NOT_A_WEIGHT_OF = "readWeights: '{name}' is not a weight of the model"
WRITEWEIGHTS_IS_NOT_A_WEIGHT_OF = "writeWeights: '{name}' is not a weight of the model"
WRITEWEIGHTS_HAS_ELEMENTS_GOT = "writeWeights: '{name}' has {size} elements, got {size2}"
RESETHOSTWEIGHTS_THE_MODEL_HAS_A_WEIGHT = "resetHostWeights: the model has a weight '{name}' this session does not"
RESETHOSTWEIGHTS_HAS_SHAPE_EXPECTED = "resetHostWeights: '{name}' has shape {shape}, expected {shape2}"
RUN_NEEDS_A_POPART_PYSTEPIO_OR = "run() needs a popart.PyStepIO or PyStepIOCallback, got {stepio_type}"
NO_STEPIO_INPUT_WAS_GIVEN_FOR = "No stepio input was given for tensor '{tensor_id}' (the model's inputs: {input_ids})"
UNEXPECTED_NUMBER_OF_INPUT_ELEMENTS_FOR = (
    "Unexpected number of input elements for Tensor {tensor_id}. Expected {nelms}, but received {size}."
)
ANCHOR_TENSOR_IS_A_GRADIENT_GRADIENTS = (
    "Anchor tensor '{anchor}' is a gradient: gradients exist in training sessions only"
)
ANCHOR_GRADIENT_OF_UNKNOWN = "Anchor tensor '{anchor}' not in Ir Tensors: '{base}' is not a tensor of the model"
INPUT_TENSOR_HAS_DATA_TYPE_THE = "Input tensor '{tensor_id}' has data type {dtype}; the model expects {data_type}"
ANCHOR_NOT_AN_UPDATED_WEIGHT = (
    "Anchor tensor '{anchor}' not in Ir Tensors: '{base}' is not a weight updated by this session"
)
ANCHOR_UNKNOWN_ID = "Anchor tensor '{anchor}' not in Ir Tensors: no tensor of the model has this id"

# --- shapes.py ---------------------------------------------------------------------------------
INPUT_TENSOR_IS_NOT_A_TENSOR = "{node}: input tensor '{missing}' is not a tensor of this graph"
UNKNOWN_OPERATOR_IN_DOMAIN = "{node}: unknown operator '{op_type}' in domain '{domain}'"
NO_ONNX_OPERATOR_IN_AI_ONNX = "{node}: no ONNX operator '{op_type}' in ai.onnx opset {version}"
SHAPE_INFERENCE_FAILED_FOR = "Shape inference failed for {node}: {exc}"
THE_SHAPE_OF_INPUT_IS_UNKNOWN = "{node}: the shape of input '{name}' is unknown"
THE_SHAPE_OF_READ_BY_ITS = "{node}: the shape of '{name}' (read by its body) is unknown"

# --- tensorinfo.py -----------------------------------------------------------------------------
UNKNOWN_DATA_TYPE_KNOWN = "Unknown data type '{dtype}'. Known: {known}"
DATA_TYPE_HAS_NO_POPART_EQUIVALENT = "Data type {dtype!r} has no PopART equivalent"
TENSORINFO_TAKES_DTYPE_SHAPE_OR_A = "TensorInfo takes (dtype, shape) or a numpy array"
