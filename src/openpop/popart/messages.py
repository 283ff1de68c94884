"""The texts of PopART's errors and warnings (PopART's exact words where it had them), raised by name;
a raise or warning site fills in the ``{fields}`` with ``.format``."""

# --- builder.py --------------------------------------------------------------------------------
NOT_AN_ONNX_MODEL = "Expected an ONNX model (bytes, a file name or a ModelProto), got {model_type}"
BUILDER_NO_ATTRIBUTE = "'Builder' object has no attribute '{name}'"
OPSET_ALREADY_DEFINED = (
    "Invalid opset '{label}{version}' selected. Opset for domain {domain} already defined as {current}"
)
ADD_INPUT_UNEXPECTED_ARGUMENTS = "addInputTensor(): unexpected arguments {kwargs}"
ADD_INPUT_NEEDS_INFO_OR_TYPE_AND_SHAPE = "addInputTensor() needs a TensorInfo or a data type and a shape"
TENSOR_UNKNOWN_TO_BUILDER = "Tensor '{tensor_id}' is not known to this builder"
NOT_A_SUBGRAPH_BUILDER = (
    "addInputTensorFromParentGraph: this builder is not a subgraph builder"
)
TENSOR_UNKNOWN_TO_PARENT = "Tensor '{tensorId}' is not known to the parent graph"
SHAPE_NOT_INFERRED = "Shape of tensor '{tensor_id}' could not be inferred"
NO_PRODUCER = "Could not find a node that produces tensor '{tensor_id}'"
VIRTUAL_GRAPH_NOT_SET = "Virtual graph not set in current scope."
PIPELINE_STAGE_NOT_SET = "Pipeline stage not set in current scope."
EXECUTION_PHASE_NOT_SET = "Execution phase not set in current scope."
NODE_HAS_NO_ATTRIBUTE = "Node does not have an attribute {attributeName}."
NODE_ALREADY_HAS_ATTRIBUTE = "Node already has attribute {attributeName}."
NODE_NOT_FOUND = "Could not find a node with outputs {outputs}. Must specify all outputs of a node"
ATTRIBUTE_WRONG_TYPE = "Attribute {attributeName} is not {kind}."
CANNOT_REMOVE_ATTRIBUTE = "Cannot remove attribute {attributeName} as it does not exist."
UNSUPPORTED_ATTRIBUTE_VALUE = "Unsupported attribute value type {value_type}"
UNTYPED_INPUT_ON_TOP_LEVEL = (
    "Can not add untyped tensors to the top-level graph. Use Builder::addInputTensor(const TensorInfo &tensorInfo, "
    "const std::string &debugPrefix) instead."
)
TOO_MANY_OUTPUTS = "{op_type} has an invalid number of outputs {num_outputs}. Must be between 0..{max_outputs}"
NO_SPATIAL_DIMENSIONS = "Input tensor has no spatial dimensions"
WINDOW_VECTOR_LENGTH = "Length of {name} vector {length} != number of spatial dimensions {spatial}"
WINDOW_PADDING_LENGTH = "Padding vector (length {length}) does not have 2 values for each spatial dimension {spatial}"
INVALID_SPATIAL_OUTPUT = "Window parameter values combine to give invalid spatial output shape: [{shape}]"
KERNEL_SHAPE_MISMATCH = (
    "kernel_shape, [{kernel}], does not match inferred shape from weight input '{weights}', [{inferred}]"
)
CONV_NEEDS_TWO_INPUTS = "Conv requires at least two inputs: data, and weights. {n} inputs provided."
PAD_VECTOR_LENGTH = "Padding vector (length {length}) doesn't contain 2 entries per input dimension {rank}"
PARTIALS_TYPE_UNSUPPORTED_OP = (
    "Builder::setPartialsType should only be called on operators: Conv, MatMul; but was given: {op_type}"
)
CONV_DITHERING_NOT_BOOL = "enableConvDithering must be a bool value"
CONV_DITHERING_NOT_CONV = (
    "Builder::setEnableConvDithering should only be called on convolutions but was given: {op_type}"
)
ADD_INPUT_SHAPE_MISSING = "addInputTensor(dtype, shape): the shape is missing"
NO_PRODUCER_TO_ANNOTATE = "Could not find a node that produces tensor '{tensor_id}' to set {attr} on"
MODEL_PARSE_FAILED = "Failed to parse the ONNX model: {exc}"
MODEL_FILE_MISSING = (
    "Failed to load a ModelProto from the string '{model}'.\nCheck that it is either a valid path to an existing "
    "onnx model file, or is a valid onnx ModelProto string."
)
MODEL_LOAD_FAILED = "Failed to load an ONNX model from '{model}': {exc}"
ADD_INPUT_UNEXPECTED_ARGUMENT = "addInputTensor(): unexpected argument {extra!r}"
ADD_INITIALIZED_INPUT_UNEXPECTED_ARGUMENT = "addInitializedInputTensor(): unexpected argument {extra!r}"

# --- sessions.py (PopART's Session) -------------------------------------------------------------
WEIGHTS_FROM_HOST_BEFORE_RUN = (
    "Must call weightsFromHost before run as the model has initializers and the session has been created in "
    "training mode"
)

# --- external_data.py, graphtransformer.py ---------------------------------------------------------
EXTERNAL_DATA_MISSING = (
    "Data of TensorProto ( tensor name: {name}) should be stored in {location}, but it doesn't exist or is not "
    "accessible."
)
EXTERNAL_NO_LOCATION = "No location information for externally stored tensor '{name}'"
EXTERNAL_FILE_UNKNOWN = "Unrecognised file name '{location}' for externally stored tensor '{name}'"
EXTERNAL_BAD_LENGTH = "Invalid 'length' information ({length}) for externally stored tensor '{name}'"
EXTERNAL_BAD_OFFSET = "Invalid 'offset' information ({offset}) for externally stored tensor '{name}'"
EXTERNAL_SIZE_CHANGED = "Externally stored tensor '{name}' holds {length} bytes, its new value {size}"
EXTERNAL_PARENT_MISSING = "Saving tensor data to file {fn}, but its parent directory does not exist"
EXTERNAL_APPEND_MISSING = "TensorIds '{ids}' to be saved externally to existing file {fn}, but file doesn't exist"
NOT_AN_INITIALIZER = "Tensor '{id}' is not an initializer"
ALREADY_EXTERNAL = "Tensor '{id}' already has an external data_location"
EXTERNAL_NO_DATA = "Tensor '{id}' has no data to save externally"
EXTERNAL_RELOCATE_EXISTS = (
    "Updating externally saved tensor location from file '{from_location}' to file '{to_location}', but file "
    "'{to_location}' already exists"
)
EXTERNAL_RELOCATE_MISSING = (
    "Updating externally saved tensor location from file '{from_location}' to file '{to_location}', but file "
    "'{from_location}' does not exist"
)
EXTERNAL_RELOCATE_NONE = "No ONNX model initializers have external location set to '{from_location}'"
NOT_IN_INITIALIZERS = "TensorId {id} not in the model initalizers"
CANNOT_CONVERT_TYPE = "cannot set tensor type {name} to type {expected}"
INT64_TOO_LARGE = (
    "In convertINT64TensorToINT32, cannot cast int64 to int32: number is too large. If you are sure you want still "
    "want to convert your tensor data, you can set 'clip' to 'true'."
)

# --- patterns.py -------------------------------------------------------------------------------
UNKNOWN_PATTERN = "Unknown pattern {name}{hint}"
UNKNOWN_PATTERN_NAME = "Unknown pattern {name}."
MANDATORY_PATTERN = "Pattern '{name}' is mandatory and cannot be disabled"
PATTERN_MUST_BE_ENABLED = "Pattern '{name}' must be enabled"

# --- dataflow.py -------------------------------------------------------------------------------
INVALID_ANCHOR_RETURN_TYPE = "Invalid anchor return type ID supplied: {artString}"
BATCHES_PER_STEP_BELOW_ONE = "batchesPerStep must be at least 1, got {batchesPerStep}"
TENSOR_IS_NOT_ANCHORED = "Tensor '{anchorId}' is not anchored"
RETURN_PERIOD_MISSING = "Must specify return period with option 'EVERYN'"
RETURN_PERIOD_NOT_POSITIVE = "Anchor return period must be greater than zero"
RETURN_PERIOD_NOT_EXPECTED = "A return period should not be supplied for this anchor return type ({artString})"
DATAFLOW_ANCHORS_ARGUMENTS = "DataFlow: give either a dict of return types or a list of ids with anchorReturnType"
ANCHOR_NOT_A_RETURN_TYPE = "Anchor '{tensor_id}': expected a popart.AnchorReturnType, got {art!r}"
RETURN_PERIOD_ABOVE_BATCHES_PER_STEP = (
    "Return period must be less than or equal to batches per step. Anchor '{tensor_id}': return period {rp}, "
    "batches per step {bps}"
)
BATCHES_PER_STEP_NOT_A_MULTIPLE = (
    "Batches per step must be a multiple of return period. Anchor '{tensor_id}': return period {rp}, batches per "
    "step {bps}"
)

# --- devices.py --------------------------------------------------------------------------------
ATTACH_OFFLINE_DEVICE = "Cannot attach to an offline IPU device"
INVALID_DEVICE_OPTION = "Invalid value '{value}' for device option '{key}'"
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
CALL_INPUT_COUNT = "call node '{node_name}': the callee takes {n_names} inputs, got {n_inputs}"
INPUT_TENSOR_HAS_NO_COMPLETE_SHAPE = (
    "Input tensor '{tensor_id}' has no complete shape in the model; give its shape with popart.InputShapeInfo"
)
INPUT_NOT_PRODUCED = (
    "{node}: input tensor '{missing}' is produced by no node, input or initializer of the model (or the graph "
    "has a cycle)"
)
TENSOR_NOT_PRODUCED = "Tensor '{missing}' is not produced by the model"
TENSOR_USED_BEFORE_ITS_STAGE = (
    "Tensor '{missing}' is used by a pipeline stage / virtual graph before the stage that produces it"
)

# --- ops/common.py ---------------------------------------------------------------------------
OP_FAILED = "{op_type} node '{node_name}': {message}"
UNSUPPORTED_OP = (
    "Op '{op_type}' (domain {domain}, opset {opset}) of node '{node_name}' (outputs: {outputs}) is not supported: "
    "no implementation for {domain}.{op_type}. popart.getSupportedOperations() lists the supported operations."
)
SHAPE_INPUT_NOT_CONSTANT = "a shape-like input is not a constant"

# --- ops/control.py ----------------------------------------------------------------------------
BODY_INPUT_COUNT = (
    "{op_type} node '{node_name}': the body graph '{name}' takes {n_names} inputs, got {n_inputs}"
)
SCAN_BEFORE_OPSET_9 = (
    "Scan node '{node_name}': opset {opset}'s Scan (with a batch axis and sequence_lens) is not supported; use "
    "ai.onnx opset 9 or later"
)
SCAN_LENGTHS_DIFFER = (
    "Scan node '{node_name}': the scan inputs have different lengths {xs} along their scan axes"
)
LOOP_DOES_NOT_END = (
    "Loop node '{node_name}' ran a million iterations without its condition turning false"
)
LOOP_RAN_NO_ITERATION = "Loop node '{node_name}' ran no iteration: its scan outputs have no shape"

# --- ops/elementwise.py ------------------------------------------------------------------------
FMOD_ZERO_ON_FLOATS = "fmod must be 1 for floating-point inputs"

# --- ops/graphcore.py --------------------------------------------------------------------------
ALLREDUCE_ACROSS_LOCAL_REPLICAS_UNSUPPORTED = (
    "replicatedallreduce of activations across local replicas is not supported by openpop"
)

# --- ops/nn.py ---------------------------------------------------------------------------------
UNSUPPORTED_RESIZE_MODE = "unsupported resize mode '{mode}'"
PADS_COUNT = "pads has {n_pads} values, expected {expected}"
SPATIAL_RANK_UNSUPPORTED = "{spatial} spatial dimensions are not supported"
CONV_TRANSPOSE_ASYMMETRIC_PADS = "asymmetric pads are not supported for ConvTranspose"
RESIZE_SCALES_AND_SIZES = (
    "Resize op has inputs for `sizes` and `scales`. Only one of these tensors should be present. If `sizes` is "
    "needed, please pass an empty string as the name of `scales` in the input list ( resize([X, roi, '', sizes]) ). "
    "If the proto is not generated from the PopART Builder, please confirm that only one of the two tensors shall "
    "have data."
)
RESIZE_SCALES_RANK = (
    "The number of dimensions of the resize op scales ({scales}) must match the number of dimensions of the "
    "input ({rank})"
)

# --- ops/reductions.py -------------------------------------------------------------------------
TOPK_K_TOO_LARGE = "K ({k}) is larger than the axis size ({axis_size})"

# --- ops/rnn.py --------------------------------------------------------------------------------
RNN_ACTIVATIONS_UNSUPPORTED = "only the default activations {defaults} are supported, got {acts}"
RNN_CLIP_UNSUPPORTED = "the clip attribute is not supported"
RNN_SEQUENCE_LENS_UNSUPPORTED = "sequence_lens shorter than the sequence are not supported"
RNN_LAYOUT_UNSUPPORTED = "layout=1 is not supported"
LSTM_PEEPHOLE_UNSUPPORTED = "peephole weights (P) are not supported"

# --- ops/shape.py ------------------------------------------------------------------------------
CONSTANT_WITHOUT_VALUE = "Constant without a value"
RESHAPE_SIZE_MISMATCH = "cannot reshape a tensor of shape {shape} to {new_shape}"
SPLIT_SIZES_MISMATCH = "split sizes {sizes} do not add up to the axis size {axis_size}"
UNSUPPORTED_PAD_MODE = "unsupported pad mode '{mode}'"
PAD_TOO_MANY_DIMENSIONS = "{mode} padding of more than the 3 last dimensions is not supported"
SLICE_STEP_ZERO = "slice steps must not be 0"
SPLIT_NOT_EVEN = "cannot split an axis of size {axis_size} into {count} equal parts"
BUCKETIZE_BOUNDARIES_RANK = "The boundaries tensor is not a 1-D tensor. The boundaries tensor rank = {rank}."
ABORT_OP = "Abort op: the program aborted"
SQUEEZE_NON_UNIT_AXIS = "cannot squeeze axis {axis} of size {axis_size}"

# --- opsets.py ---------------------------------------------------------------------------------
OPSET_HAS_NO_OPERATOR = "'{label}' opset {version} has no operator '{name}'"
ONNX_OPERATOR_ON_AI_GRAPHCORE = "{op_type} is an ai.onnx operator"
CALL_ON_AI_ONNX = "call is an ai.graphcore operator"
INCOMPATIBLE_FUNCTION_ARGUMENTS = (
    "{method}(): incompatible function arguments. The following argument types are supported:\n"
    "    1. ({signature}) -> ...\n\nInvoked with: {invoked}"
)
MULTICONV_NO_INPUTS = "MultiConvOp '{name}' has no input tensors. Provide at least one set of inputs"
MULTICONV_TOO_FEW_INPUTS = (
    "Each convolution of MultiConvOp '{name}' must have at least two inputs - data and weights"
)
MULTICONV_TOO_MANY_INPUTS = (
    "Each convolution of MultiConvOp '{name}' can have at most three inputs - data, weights, and bias"
)
MULTICONV_PARAMETER_SETS = (
    "For MultiConvOp '{name}', number of {param} parameter sets ({sets}) does not match the number of input sets "
    "({inputs})"
)
NLL_LABEL_SHAPE = (
    "The label tensor ({labels}) must have shape [{expected}] to match all but the final dimension of the "
    "probabilities tensor ({probs})"
)
INFERENCE_WITHOUT_ANCHORS = "User must specify an anchor tensor when doing inference."
LOSS_NOT_SCALAR = "Loss tensor, '{loss}', must be a scalar tensor"
CALL_OUTPUT_COUNT_MISMATCH = (
    "For CallOp '{name}', number of outputs ({n}) does not match that of the callee subgraph ({callee})"
)
CALL_INPUT_COUNT_MISMATCH = (
    "For CallOp '{name}', number of inputs ({n}) does not match that of the callee subgraph ({callee})"
)
SPARSE_CONSTANT_UNSUPPORTED = "constant(): is_value_sparse=True (a sparse constant) is not supported by openpop"

INPUT_SETTINGS_ARGUMENTS = (
    "InputSettings(): takes (tileSet=TileSet.Compute, exchangeStrategy=ExchangeStrategy.JustInTime) or "
    "(ReplicatedStreamMode)"
)

UNKNOWN_OPSET = "Could not find opset {version}"

# --- graph_checks.py ---------------------------------------------------------------------------
ALL_OPS_PRUNED = "All operations in the main graph were pruned, nothing to compute"
AUTO_AND_MANUAL_RECOMPUTATION = "A mixture of auto and manual recomputation is not supported"
WRITE_WEIGHTS_WITH_CONSTANT_WEIGHTS = (
    "Cannot call writeWeights when constantWeights is set. Set `constantWeights` to False in the "
    "`SessionOption`s when initialising the session to enable this behaviour."
)

LSTM_ACTIVATION_UNSUPPORTED = "Activation type '{act}' is not supported"
LSTM_ACTIVATIONS_DIFFER = "LSTM activations must be the same for output and forget gates."
LSTM_TOO_MANY_ACTIVATIONS = "Too many activations ({n}) specified. Number of activations should be 1 or 3."
LSTM_ACTIVATION_ATTRIBUTE = "LSTMOp attribute `{name}' is not supported"

# --- loss_scaling.py (PopART's AutomaticLossScale transform) -----------------------------------
ALS_NOT_TRAINING = "[AutomaticLossScale transform] Only compatible when doing training"
ALS_CONST_LOSS_SCALING = "[AutomaticLossScale transform] The optimizer must have non-const loss scaling"
ALS_CONTINUOUS_PIPELINING = (
    "[AutomaticLossScale transform] Automatic loss scaling is not currently supported when the "
    "'enablePipelining' SessionOption is set to 'true', but the 'enableGradientAccumulation' SessionOption "
    "is set to 'false'"
)
ALS_TO_TRACK_WITHOUT_METHOD = (
    "[AutomaticLossScale transform] toTrackTensors has been set, but gradientTensorTrackingMethod has not been "
    "set to 'GradientTensorTrackingMethod::GradientsOfUserSpecifiedTensors'."
)
ALS_METHOD_WITHOUT_TO_TRACK = (
    "[AutomaticLossScale transform] gradientTensorTrackingMethod set to "
    "'GradientTensorTrackingMethod::GradientsOfUserSpecifiedTensors' but 'toTrackTensors' has not been set"
)
ALS_NO_TRACKED_TENSORS = "[AutomaticLossScale transform] No tracked gradient tensors of type fp16 were found."
ALS_BIN_EDGE_RANGE = (
    "[AutomaticLossScale transform] Out of range value for 'binEdgeLocation'. The current value is {value}, "
    "but it should be in the range [0, 1]."
)
ALS_THRESHOLD_RANGE = (
    "Out of range value for 'thresholdUpperCountProportion'. The current value is {value}, but it should be "
    "in the range [0, 1]."
)

# --- optimizers.py -----------------------------------------------------------------------------
CLIP_ALL_WEIGHTS_NOT_ALONE = (
    "Multiple clip groups specified, but one has the mode 'ClipAllWeights'. When using "
    "ClipNormSettings.clipAllWeights(...), only one group should be specified."
)
CLIP_WEIGHT_NOT_UPDATED = "No Ir::Tensor with TensorId '{id}' in Tensors::get(..)"
OPTIMIZER_VALUE_NOT_A_PAIR = "Optimizer values are (value, isConst) pairs, got {v!r}"
UNKNOWN_OPTIMIZER_PARAMETER = "Unknown optimizer parameter '{unknown}' for {self_type}; valid: {keys}"
INSERT_SPECIFIC_NOT_A_WEIGHT = "insertSpecific: '{unknown}' is not a trainable weight of the model"
UPDATED_OPTIMIZER_TYPE_DIFFERS = (
    "updateOptimizerFromHost: the new optimizer ({new_type}) must be of the type the session was built with "
    "({self_type})"
)
ADAM_NO_BIAS_L2_UNSUPPORTED = "AdamNoBias with L2Regularization is not supported by openpop"
CLIP_NORM_SETTINGS_TYPE = "clip_norm_settings must be popart.ClipNormSettings objects"
INVALID_WEIGHT_SPECIFIC_PARAMETER = "Invalid weight-specific optimizer parameter '{k}' for {weightId}"
CONSTANT_OPTIMIZER_VALUE_CHANGED = (
    "updateOptimizerFromHost: '{name}'{of_weight} is constant ({value}) and cannot be changed"
)
ADAMAX_DECOUPLED_DECAY_UNSUPPORTED = (
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
BUFFER_SIZE_MISMATCH = "Buffer for '{name}' has {size} elements, expected {expected}"
DATAFLOW_TYPE = "dataFlow must be a popart.DataFlow, got {dataFlow_type}"
NO_DEVICE = "No device given (deviceInfo is None): acquire one with popart.DeviceManager()"
DEVICE_INFO_TYPE = "deviceInfo must be a popart.DeviceInfo, got {deviceInfo_type}"
USER_OPTIONS_TYPE = "userOptions must be a popart.SessionOptions, got {options_type}"
REPLICATION_BELOW_ONE = "replicatedGraphCount must be at least 1"
ACCUMULATION_IN_INFERENCE = "Gradient Accumulation only available when training."
RUN_OFFLINE_DEVICE = "Cannot run on an offline IPU device: it only compiles"
RESET_HOST_WEIGHTS_WITH_CONSTANT_WEIGHTS = (
    "Cannot call resetHostWeights when constantWeights is set: set SessionOptions.constantWeights = False"
)
NO_SUCH_TENSOR = "No tensor '{id}' in the model"
LOSS_TYPE = "loss must be a tensor id (str), got {loss_type}"
LOSS_NOT_IN_MODEL = "The loss tensor '{loss}' is not a tensor of the model"
OPTIMIZER_TYPE = (
    "optimizer must be a popart optimizer (SGD, ConstSGD, Adam, Adaptive), got {optimizer_type}"
)
IPUS_NOT_A_MULTIPLE_OF_REPLICAS = (
    "The number of IPUs requested ({numIpus}) must be a multiple of replicatedGraphCount ({replicationFactor})"
)
NOT_ENOUGH_IPUS_FOR_MODEL = (
    "The model needs {needed} IPUs ({ipus_per_replica} virtual graphs x {replicationFactor} replicas) but the "
    "device has {numIpus}"
)
READ_WEIGHTS_UNKNOWN = "readWeights: '{name}' is not a weight of the model"
WRITE_WEIGHTS_UNKNOWN = "writeWeights: '{name}' is not a weight of the model"
WRITE_WEIGHTS_SIZE_MISMATCH = "writeWeights: '{name}' has {size} elements, got {given}"
RESET_HOST_WEIGHTS_UNKNOWN = "resetHostWeights: the model has a weight '{name}' this session does not"
RESET_HOST_WEIGHTS_SHAPE_MISMATCH = "resetHostWeights: '{name}' has shape {shape}, expected {expected}"
STEPIO_TYPE = "run() needs a popart.PyStepIO or PyStepIOCallback, got {stepio_type}"
STEPIO_INPUT_MISSING = "No stepio input was given for tensor '{tensor_id}' (the model's inputs: {input_ids})"
INPUT_ELEMENT_COUNT = (
    "Unexpected number of input elements for Tensor {tensor_id}. Expected {nelms}, but received {size}."
)
ANCHOR_GRADIENT_IN_INFERENCE = (
    "Anchor tensor '{anchor}' is a gradient: gradients exist in training sessions only"
)
ANCHOR_GRADIENT_OF_UNKNOWN = "Anchor tensor '{anchor}' not in Ir Tensors: '{base}' is not a tensor of the model"
INPUT_DATA_TYPE_MISMATCH = "Input tensor '{tensor_id}' has data type {dtype}; the model expects {data_type}"
ANCHOR_NOT_AN_UPDATED_WEIGHT = (
    "Anchor tensor '{anchor}' not in Ir Tensors: '{base}' is not a weight updated by this session"
)
ANCHOR_UNKNOWN_ID = "Anchor tensor '{anchor}' not in Ir Tensors: no tensor of the model has this id"

# --- shapes.py ---------------------------------------------------------------------------------
INPUT_NOT_IN_GRAPH = "{node}: input tensor '{missing}' is not a tensor of this graph"
UNKNOWN_OPERATOR = "{node}: unknown operator '{op_type}' in domain '{domain}'"
NO_ONNX_OPERATOR_IN_OPSET = "{node}: no ONNX operator '{op_type}' in ai.onnx opset {version}"
SHAPE_INFERENCE_FAILED = "Shape inference failed for {node}: {exc}"
INPUT_SHAPE_UNKNOWN = "{node}: the shape of input '{name}' is unknown"
BODY_READ_SHAPE_UNKNOWN = "{node}: the shape of '{name}' (read by its body) is unknown"

# --- tensorinfo.py -----------------------------------------------------------------------------
UNKNOWN_DATA_TYPE = "Unknown data type '{dtype}'. Known: {known}"
NO_POPART_DATA_TYPE = "Data type {dtype!r} has no PopART equivalent"
TENSOR_INFO_ARGUMENTS = "TensorInfo takes (dtype, shape) or a numpy array"

# --- graph.py, sessions.py: the model's own data -------------------------------------------------
INITIALIZER_UNREADABLE = (
    "Initializer '{name}' of the ONNX model cannot be read: its data does not fit its type {data_type} and "
    "shape {dims} ({exc}). Export the model again (or fix the initializer)"
)
ZERO_SIZED_INPUT = (
    "Input tensor '{tensor_id}' has shape {shape}, which has no elements: give it a shape of at least one "
    "element (popart.InputShapeInfo, or the model's input)"
)
MODEL_FIELD_NOT_TEXT = (
    "Failed to parse the ONNX model: {field} is not UTF-8 text (the file is damaged, or not an ONNX model)"
)
