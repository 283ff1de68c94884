"""PopTorch's exception types, and the texts of the errors of openpop's PopTorch API.

The rule for messages (checked by tests/test_error_messages.py):

* Every error and warning text lives in one module and is raised or logged by name. PopTorch's
  API (the modules directly under ``openpop/``, ``runtime/``, ``poptorch/``) keeps its texts
  here, except the runtime's openpop-specific ones (devices, backends, caches, poprun instances,
  reports), which are in ``runtime/messages.py``; each other package keeps its own in its
  ``messages.py`` (``data``, ``optim``, ``bert``, ``custom_ops``, ``distributed``, ``k8s``,
  ``lightning``, ``popart``). A raise or warning site may fill a text in with ``.format(...)`` or ``%`` but
  never spells prose itself (info and debug log lines may).
* Where PopTorch (or PopART, popdist, Lightning) had a text, the constant holds its exact words.
* User input is checked with explicit raises, never ``assert``: ``python -O`` changes nothing.

Which exception type, kept for PopTorch compatibility (code catches these):

==================================  =====================================================
``AssertionError``                  PopTorch's ``assert`` checks on user input: ``Options``
                                    setters, strategies/stages, DataLoader arguments,
                                    optimizer accumulator types, ``VariableAttributes``
``ValueError``                      bad values PopTorch rejected with ``ValueError``
                                    (e.g. ``setPartialsType``, ``amsgrad``, op arguments)
``poptorch.Error``                  what PopTorch's C++ side raised: compile/run-time
(``createPoptorchError``)           problems, op argument checks (``'poptorch_py_error'``)
``RuntimeError``                    wrapping twice, ``popdist.poptorch.Options`` misuse,
                                    backends' own failures
``AttributeError``                  setting frozen or unknown ``Options`` attributes
``ConfigFileError``                 a malformed ``Options.loadFromFile`` line
package errors                      ``ManifestError`` (k8s), ``UsageError`` (poprun),
                                    ``ConfigError``/``DataError``/``CheckpointError`` (bert)
==================================  =====================================================
"""


class Error(Exception):
    """``poptorch.Error``: carries ``message``, ``type`` and ``location``."""

    def __init__(self, message="", *, type="poptorch_py_error", location=""):
        super().__init__(message)
        self.message = message
        self.type = type
        self.location = location


class RecoverableError(Error):
    def __init__(self, message="", *, recovery_action="", **kw):
        super().__init__(message, **kw)
        self.recovery_action = recovery_action


class UnrecoverableError(Error):
    pass


class PipelineDepthError(Error):
    """``poptorch.PipelinedExecution`` has too few micro-batches for the model's pipeline stages
    (training needs ``gradientAccumulation >= 2 * stages - 1``, inference ``deviceIterations >=
    stages``). ``stages`` is the forward stage count, so callers that can run the model another
    way (Lightning's ``IPUStrategy`` falls back to ``ShardedExecution``) need not parse the text."""

    def __init__(self, message: str, *, stages: int):
        super().__init__(f"'poptorch_py_error': {message}", type="poptorch_py_error")
        self.stages = stages


class ConfigFileError(Exception):
    """Raised by ``Options.loadFromFile`` for a malformed line."""


def createPoptorchError(msg: str) -> Error:
    """Build the ``poptorch.Error`` that Python-side checks raise."""
    return Error(f"'poptorch_py_error': {msg}", type="poptorch_py_error")


def with_fix(text: str, fix: str) -> str:
    """PopTorch's error ``text`` as PopTorch words it, then one line saying what to do."""
    return f"{text}\nopenpop: {fix}"


def shorten(text: str, limit: int = 200) -> str:
    """``text`` for quoting in a message: its first ``limit`` characters, then ``...``."""
    return text if len(text) <= limit else text[:limit] + "..."


def check_type(value, expected, where: str, name: str, fix: str = "") -> None:
    """PopTorch's ``assert isinstance(value, expected)`` on an argument, kept under ``python -O``;
    ``fix``: the line ``with_fix`` adds."""
    if not isinstance(value, expected):
        wanted = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
        text = WRONG_TYPE.format(where=where, name=name, expected=wanted, got=type(value).__name__, value=value)
        raise AssertionError(with_fix(text, fix) if fix else text)

# --- executor -------------------------------------------------------------------
NO_EXECUTABLE = "Model has not been compiled or has been destroyed."
ALREADY_WRAPPED = ("Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() "
                   "on the model to unwrap before wrapping again.")
INVALID_BATCH_DIM = (
    "Invalid batch dimension: In the input {name}, the batch dimension ({batch}) must be a multiple of "
    "Options.deviceIterations({di}) * (Options.replicationFactor({rf}) / "
    "Options.inputReplicaGrouping.input_group_size({gs})) * Options.Training.gradientAccumulation({ga}) "
    "= {total} because it is used to calculate the batch size which will be executed on the device in "
    "any given iteration. For a full explanation see the batching semantics page of the documentation.")
# The documentation's page on batching (PopTorch's text points to its "batching semantics page").
BATCHING_DOCS = "docs/guides/poptorch.md#batching"
INVALID_BATCH_DIM_FIX = ("give {name} a batch of a multiple of {total} samples (for example {suggested}), or let "
                         "poptorch.DataLoader(options, dataset, batch_size=<micro-batch>) build such batches; "
                         "batching is explained in " + BATCHING_DOCS)
EXECUTION_STRATEGY_FIX = ("use poptorch.PipelinedExecution, ShardedExecution, SerialPhasedExecution or "
                          "ParallelPhasedExecution")
INFERENCE_GRAD_ACCUM = (
    "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its default "
    "value (1) when running a poptorch.inferenceModel().")
INFERENCE_GRAD_ACCUM_PIPELINE = (
    " Use poptorch.Options().deviceIterations to process a sufficient number of batches each run for "
    "pipelined execution instead.")
NO_LOSS = "Couldn't find a loss in graph!"
NO_LOSS_FIX = ("a trainingModel's forward must return its loss: the result of a torch loss (F.cross_entropy, "
               "nn.MSELoss()(...), ...), or any other value wrapped in poptorch.identity_loss(value, reduction='mean')")
MULTIPLE_LOSSES = ("Multiple independent losses found in graph. Graph must have one final loss. "
                   "Wrap final graph loss in poptorch.identity_loss.")
BACKWARD_ON_OUTPUT = (
    "backward() cannot be called explicitly on outputs of a PopTorch model. If you're using a "
    "trainingModel, the backwards pass is performed automatically when invoking the model. If you're "
    "using an inferenceModel, you should use a trainingModel instead.")
OFFLINE_CALL = ("Trying to run a model on an offline device (ConnectionType.Never): use "
                "model.compile(inputs) instead of model(inputs)")
NOT_ATTACHED = "Device is not attached"
ALREADY_ATTACHED = "Device is already attached"
COMPILE_IGNORED = "Call to compile() ignored: the executable is already compiled"
COMPILE_TIME_NOT_COMPILED = "Please compile the model before obtaining compilation time."
COMPILE_TIME_NO_BAR = "Please set showCompilationProgressBar option to obtain compilation time."
CYCLE_COUNT_DISABLED = "Cycle count logging is disabled. Please set option logCycleCount to True to enable."
CYCLE_COUNT_NOT_RUN = "Please run the model at least once before obtaining cycle count."
NO_UPDATABLE_BUFFERS = "No named buffers marked as updatable via updatableNamedBuffers option"
UNKNOWN_UPDATABLE_BUFFERS = ("Options.updatableNamedBuffers names buffers the model does not have: {unknown} "
                             "(its buffers: {buffers}). Use the names model.named_buffers() gives.")
INPUT_REQUIRES_GRAD = ("Input tensor has requires_grad=True set. This tensor will be detached because "
                       "backward pass via inputs is not supported.")
INPUT_NOT_CONTIGUOUS = ("At least one input tensor is not contiguous: non-contiguous tensors will be "
                        "converted.")
INPUT_NOT_WRITTEN_BACK = ("The model changed an input in place, but the change cannot be written back to "
                          "the caller's tensor: {problem}. Pass a tensor that owns its memory (e.g. "
                          "x.clone()) to see the change.")
DICT_INPUTS = ("Dicts as inputs only have partial support, they can be accessed using literal keys, but "
               "full Python functionality is not enabled. Consider changing dict inputs to tuple.")
INPUT_MISMATCH_SUFFIX = (
    "\nThis error occurred because the inputs passed at runtime don't match the inputs used to compile "
    "the model.\nTo recompile the model for the new inputs create a new inferenceModel / trainingModel "
    "wrapper or call destroy() on the curent one and try again.")
BROADCAST_BUFFERS = (
    "PopTorch does not support broadcasting buffers. If your model is able to tolerate buffers becoming "
    "out of sync between replicas, you can disable buffer broadcasting using "
    "poptorch.Options.broadcastBuffers(False).")
BUFFER_REMOVED = "Buffer {name} is removed from the model when calling the forward method."
BUFFER_REASSIGNED = (
    "Buffer {name} is reassigned within the model when calling the forward method. This is not "
    "supported. Consider using self.{name}.copy_(src) to copy data from a source tensor, where src is "
    "the name of the source tensor.")
PARAMETER_REMOVED = "Parameter {name} is removed from the model when calling the forward method."
PARAMETER_REASSIGNED = (
    "Parameter {name} is reassigned within the model when calling the forward method. This is not "
    "supported. Consider using self.{name}.copy_(src) to copy data from a source tensor, where src is "
    "the name of the source tensor.")
ZERO_SIZED = "Zero-sized tensors are unsupported (Got shape {shape})"

# --- options --------------------------------------------------------------------
WRONG_TYPE = "{where}: {name} must be a {expected}, got {got} {value!r}"
FROZEN_OPTIONS = "Can't modify frozen Options"
INVALID_ATTRIBUTE = "Invalid attribute {name}."
TRACE_MODEL_TRUE = "options.Jit.traceModel(True) is no longer supported"
INTEGER_AT_LEAST = "{setter}: {option} must be an integer >= {minimum}, not {value!r}"
AUTOCAST_ENABLED = "Precision.autocast(enabled=...) needs a bool, not {enabled!r}"
AUTOCAST_DTYPE = "Precision.autocast(dtype=...) must be torch.bfloat16 or torch.float16, not {dtype!r}"
FLOATING_POINT_EXCEPTIONS_BOOL = "enableFloatingPointExceptions needs to be set to a bool"
STOCHASTIC_ROUNDING_BOOL = "enableStochasticRounding needs to be set to a bool"
RUNNING_STATISTICS_FLOAT_BOOL = "runningStatisticsAlwaysFloat needs to be set to a bool"
REDUCTION_TYPE = (
    "accumulationAndReplicationReductionType must be set to poptorch.ReductionType.Mean or "
    "poptorch.ReductionType.Sum")
AUTOMATIC_LOSS_SCALING_BOOL = "setAutomaticLossScaling needs to be set to a bool"
ROLLBACK_FAILED_CALLS_BOOL = "Training.rollbackFailedCalls needs a bool, not {enabled!r}"
PROCESS_ID_OUT_OF_RANGE = (
    "Options.Distributed.configureProcessId: process_id ({process_id}) must be smaller than num_processes "
    "({num_processes})")
NUM_IO_TILES = "numIOTiles must be an even number between 32 and 192."
INPUT_GROUP_TYPE_ALL = "input_group_type cannot be All"
INPUT_GROUP_SIZE_TOO_LARGE = "input_group_size cannot be larger than replication_factor"
INPUT_GROUP_SIZE_NOT_FACTOR = "input_group_size must be a factor of replication_factor"
OUTPUT_MODE_NOT_PICKED = "An output mode must be picked before serialisation"
INVALID_PRIVATE_ATTRIBUTE = (
    "Invalid private attribute {name}: private attributes must be created in __init__ before the options "
    "values")
INVALID_OPTION = "Invalid option %s, valid options are %s"
UNEXPECTED_OPTION_TYPE = "Unexpected type %s for option %s. Expected %s"
PARTIALS_TYPE_SETTER = "parameter to setPartialsType should be eithertorch.float or torch.half"
LOSS_SCALING_GROWTH_FACTOR = "setAutomaticLossScaling: growth_factor must be a number > 1, not {growth_factor!r}"
LOSS_SCALING_BACKOFF_FACTOR = (
    "setAutomaticLossScaling: backoff_factor must be a number between 0 and 1, not {backoff_factor!r}")
LOSS_SCALING_GROWTH_INTERVAL = (
    "setAutomaticLossScaling: growth_interval must be a positive int, not {growth_interval!r}")
EVERY_N_PERIOD = "EveryN anchor must have output_return_period set to valid positive integer"
MEMORY_PROPORTION_KEYS = (
    "Available memory proportions are expected to be in a dictionary of {\"IPU0\": 0.5} where the 0 in IPU "
    "is the index of the IPU. Invalid key: %s")
MERGE_COMMON_KEYS = "Can't merge dictionaries, they have some keys in common: {common}"
CONFIG_FILE_SYNTAX_ERROR = "SyntaxError at line {number} of file: {msg}\n> {line}"
CONFIG_FILE_NOT_UTF8 = ("line {number} of {path} is not UTF-8 text (byte {offset} of the file): save the options "
                        "file as UTF-8 (setter calls such as deviceIterations(4), one per line)")
RANDOM_SEED_RANGE = "Options.randomSeed: random_seed must be an integer from -2**63 to 2**64 - 1, not {random_seed!r}"
DISTRIBUTED_ENV_NOT_INTEGER = ("Options.Distributed: the environment variable {name}={value!r} is not an integer: "
                               "set it to a whole number, or unset it")
SINGLE_VALUE = "{path} takes a single value, got {value!r}"
JSON_TOO_DEEP = "nested too deeply"
OPTIONS_JSON = ("{source} is not valid JSON ({error}): {text!r}. Expected an object of setters, e.g. "
                "'{{\"deviceIterations\": 4, \"Training.gradientAccumulation\": 2}}'")
OPTIONS_JSON_OBJECT = ("{source} must be a JSON object of setters (e.g. '{{\"deviceIterations\": 4}}'), "
                       "got {type}: {text!r}")
COMPILE_AFTER = "compile_after must be a number of seconds >= 0, not {compile_after!r}"
PROFILING_OVERRIDDEN = ("Profiling setting overriden by environment variable. Check content of "
                        "POPLAR_ENGINE_OPTIONS.")

# --- ops ------------------------------------------------------------------------
FOR_LOOP_TRAINING = "poptorch.for_loop() is only supported in inference."
COND_TRAINING = "poptorch.cond() is only supported in inference."
NO_ACTIVE_BLOCK = "No active Block, all the ops must belong to a Block"
NO_ACTIVE_BLOCK_FIX = ("{op} ran after a `with poptorch.Block(...)` ended and before the next one started: "
                       "move it into a Block, or start the next Block before it")
POPTORCH_OP = "a poptorch op"  # NO_ACTIVE_BLOCK_FIX's op where the aten op is not known
PRINT_TENSOR_NOT_TENSOR = "ipu print tensor must take a torch.tensor argument."
NOP_NOT_TENSOR = "nop must take a torch.tensor argument."
AVAILABLE_MEMORY_NOT_TENSOR = "You may only set available memory for torch.tensor values."
OVERLAP_NOT_TENSOR = "You may only set overlap for torch.tensor {what}."
SLICE_INPUT_NOT_TENSOR = "{op} must take a torch.tensor input."
SLICE_START_NOT_TENSOR = "Slice start argument to {op} must be a torch.tensor."
DYNAMIC_UPDATE_SRC_NOT_TENSOR = "Src argument to dynamic_update must be a torch.tensor."
UNSUPPORTED_VALUE_TYPE = "{message} {value_type} is not supported."
AVAILABLE_MEMORY_PROPORTION = (
    "available_memory_proportion must be a number between 0 and 1, got {value!r}")
MATMUL_SERIALIZATION_MODE = "mode must be a poptorch.MatMulSerializationMode, got {mode!r}"
MATMUL_SERIALIZATION_FACTOR = "factor must be an int, got {factor!r}"
MATMUL_KEEP_PRECISION = "keep_precision must be a bool, got {keep_precision!r}"
OVERLAP_MODE = "mode must be a poptorch.OverlapMode, got {mode!r}."
DIMENSION_NOT_INTEGER = "Dimension must be an integer."
SIZE_NOT_INTEGER = "Size must be an integer."
DIMENSION_OUT_OF_RANGE = "Dimension {dim} is out of range for a tensor of {rank} dimensions."
SLICE_START_NOT_ONE_INTEGER = (
    "Slice start argument to {op} must hold one integer, got a {dtype} tensor of shape {shape}.")
SLICE_EMPTY = "The start and end of a slice must be different."
SLICE_END_BEFORE_START = "Taking a slice of a tensor with the end less than the start is not supported."
STEP_NOT_INTEGER = "Step must be an integer."
STEP_NOT_POSITIVE = "Step must be a positive integer, got {step}."
DYNAMIC_UPDATE_DIMENSIONALITY = "input and src tensors must have same dimensionality. ({input_rank}) vs ({src_rank})"
DYNAMIC_UPDATE_DTYPE = "input and src tensor must have same dtype. ({input_dtype} vs {src_dtype})"
DYNAMIC_UPDATE_SHAPE = (
    "dynamic_update: src must have shape {expected} (input shape with dimension {dim} of size {size}), got "
    "{shape}.")
FOR_LOOP_INPUTS_NOT_LIST = (
    "poptorch.for_loop expects input tensors (inputs) to be a list of tensors. (Object is not list)")
FOR_LOOP_COUNT = "poptorch.for_loop expects count to be a non-negative int, got {count!r}"
COND_INPUTS_NOT_LIST = (
    "poptorch.cond expects then_inps and else_inps tensors to be a list of tensors. (Object is not list)")
FLOAT_FORMAT = "Invalid float_format '{float_format}': expected one of {choices}"
INPUTS_NOT_TENSORS = "All inputs must be tensors"
SLICE_OUTSIDE_DIMENSION = "{op}: the slice [{first}, {end}) is outside dimension {dim} of size {length}."
FOR_LOOP_INPUT_NOT_TENSOR = (
    "poptorch.for_loop expects input tensors (inputs) to be a list of tensors. (Object contained in list "
    "at index {index} is not torch.tensor)")
FOR_LOOP_BODY_OUTPUTS = (
    "poptorch.for_loop: the body returned {values_count} tensors but takes {inputs_count}: it must return "
    "as many tensors as it takes.")
ENABLE_CONV_DITHERING_VALUE = "value must be bool or list of bools"
CONVOLUTION_PLAN_TYPE = "Invalid plan type!"
PER_CONV_RESERVED_TILES = "perConvReservedTiles expects an int, got {value!r}"
CYCLE_BACK_OFF = "cycleBackOff expects a float, got {value!r}"
NAME_SCOPE_NOT_STRING = "Parameter to NameScope must be a string"
PARTIALS_TYPE = "Invalid partials types. Expecting torch.float or torch.half"

# --- strategies -----------------------------------------------------------------
UNKNOWN_BLOCK = "Unknown Block '{block_id}' list of expected Blocks: {expected}"
BLOCK_IN_TWO_STAGES = "{block_id} associated with more than one stage"
SAME_AS_IPU_WITHOUT_IPU = ("poptorch.AutoStage.SameAsIpu was selected but no IPU was specified for "
                           "block {block_id}")
NO_PHASES = ("There is currently no AutoStage for PhasedExecution, please explicitly specify the "
             "phases")
PARALLEL_PHASE_PARITY = ("When phases are executed in parallel: even phases must run on even IPUs "
                         "and odd phases on odd IPUs")
IPU_INDEX = "{where}: {name} must be an integer >= 0 (the index of an IPU), not {ipu!r}"
STAGE_ARGUMENT = "Each stage must be a poptorch.Stage, a block id or a list of block ids, got {arg!r}"
BLOCK_IDS_NOT_STRINGS = "Block IDs are supposed to be strings but got {block_ids}"
PHASE_IPU_COUNT = "Phase contains {stages_count} stages but you provided {ipus_count} ipus"
PHASE_ARGUMENTS = "All arguments must either be block ids (strings) or Stages: {types}"
NO_SUCH_BLOCK = "Unknown block {block_id}"
AUTO_STAGE_NOT_ALONE = "An AutoStage must be the only argument of the execution strategy"
PHASE_INDEX = "Phases are identified by positive integers"

# --- __init__ -------------------------------------------------------------------
NO_SUCH_ATTRIBUTE = "module 'poptorch' has no attribute '{name}'"
ANCHOR_MODE_DEPRECATED = ("poptorch.AnchorMode is deprecated: use poptorch.OutputMode instead, previous name "
                          "was misleading")

# --- annotations ----------------------------------------------------------------
BLOCK_TARGET_TYPE = "module is not an instance of torch.nn.Module or function."
ALREADY_IN_BLOCK = "module has already been assigned to a block."
REMOVE_BLOCKS_NOT_MODULE = "removeBlocks expects a torch.nn.Module"

# --- arg_parsers ----------------------------------------------------------------
ARG_PARSER_TYPE = "arg_parser must inherit from ICustomArgParser"

# --- compile_hooks --------------------------------------------------------------
PRE_COMPILE_HOOK_NOT_CALLABLE = "Pre-compile hook must be callable"
POST_COMPILE_HOOK_NOT_CALLABLE = "Post-compile hook must be callable"

# --- log ------------------------------------------------------------------------
LOG_LEVEL_UNKNOWN = "Unknown log level: {level}. Valid values are DEBUG, ERR, INFO, OFF, TRACE and WARN"
LOG_LEVEL_INTEGER = "Invalid log level integer"

# --- models ---------------------------------------------------------------------
EXECUTABLE_WITHOUT_MODEL = (
    "{filename} was saved with export_model=False: create the model, wrap it, then call "
    "loadExecutable(filename) on the wrapper.")

# --- special_ops ----------------------------------------------------------------
CTC_PROBS_TYPE = "ctc_beam_search_decoder: probs must be a torch.tensor argument. {probs_type} is not supported."
CTC_LENGTHS_TYPE = (
    "ctc_beam_search_decoder: lengths must be a torch.tensor argument. {lengths_type} is not supported.")
CTC_PROBS_SHAPE = (
    "ctc_beam_search_decoder: probs must have shape [input_length, batch_size, num_classes], got {shape}.")
CTC_LENGTHS_SHAPE = "ctc_beam_search_decoder: lengths must have shape [{batch_size}], got {shape}."
CTC_BLANK_INDEX = "ctc_beam_search_decoder: blank ({blank}) must be a class index in [0, {num_classes})."
CTC_TOP_PATHS = (
    "ctc_beam_search_decoder: need 1 <= top_paths <= beam_width, got top_paths={top_paths}, "
    "beam_width={beam_width}.")
FPS_SRC_TYPE = "`fps` must take a torch.tensor input. {src_type} is not supported."
FPS_PTR_TYPE = "`ptr` must be a list of integers."
FPS_PTR_TOO_SHORT = "`ptr` must containt at least 2 elements."
FPS_RATIO_TYPE = "`ratio` must be of float type. {ratio_type} is not supported."
FPS_RANDOM_START_TYPE = "`random_start` must be of bool type. {random_start_type} is not supported."
FPS_RATIO_RANGE = "`ratio` must be in (0, 1], got {ratio}."
FPS_PTR_OFFSETS = "`ptr` must be non-decreasing offsets into the {shape} rows of `src`, got {ptr}."
NEAREST_BATCH_TYPE = "`{name}` must be a torch.Tensor or a list, got {batch_type}."
NEAREST_BATCH_SHAPE = "`{name}` must hold one batch index per point ({n}), got shape {shape}."
NEAREST_X_TYPE = "`nearest` must take a torch.tensor `x` input. {x_type} is not supported."
NEAREST_Y_TYPE = "`nearest` must take a torch.tensor `y` input. {y_type} is not supported."
NEAREST_EMPTY_EXAMPLE = "`nearest`: some example of `x` has no point in `y`."

# --- torch_compat ----------------------------------------------------------------------------
NO_PRIVATE_NAME = "module {module!r} has no attribute {name!r}"  # (Python's own text for a module)

# --- runtime (PopTorch's texts; openpop's own are in runtime/messages.py) -------
MANDATORY_PARAMETER = "Mandatory parameter {name} missing"
OPTIONS_TYPE = "Invalid type: 'options' is of type {type} (Expected poptorch.Options)"
INFERENCE_OPTIMIZER = "An inference model cannot have an optimizer"
SET_OPTIMIZER_INFERENCE = "setOptimizer is only available on a training model"
OPTIMIZER_NEEDS_RUNNING_MEAN = (
    "Invalid optimizer: the new optimizer would require changing "
    "options.Training.meanAccumulationAndReplicationReductionStrategy to "
    "poptorch.MeanReductionStrategy.Running but the executable is already compiled.")
ATTACH_OFFLINE = "Trying to attach to an offline device (ConnectionType.Never)"
NO_ANCHORED_TENSOR = "No tensor with name {name} found."
UNSUPPORTED_REDUCTION = "Unsupported reduction type!"
RESERVING_IPUS = "Reserving %d IPUs when the model specifices the use of only %d. %d will be reserved but not used."
INTERNAL_CAST_TYPE = ("torch.ops.poptorch.internal_cast: unknown type '{dtype}'. openpop: name one of PopART's "
                      "types: {known}.")
IDENTITY_LOSS_REDUCTION_CODE = ("torch.ops.poptorch.identity_loss: reduction {reduction} is not one of 0 (sum), "
                                "1 (mean) or 2 (none). openpop: or call poptorch.identity_loss(x, reduction='mean').")
