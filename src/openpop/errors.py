"""PopTorch's exception types and the exact texts of its user-facing errors.

Every message a user can observe lives here once, so tests and code share it.
``Error`` derives from ``Exception`` (not ``RuntimeError``), as in PopTorch.
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


# --- executor ------------------------------------------------------------------
NO_EXECUTABLE = "Model has not been compiled or has been destroyed."
ALREADY_WRAPPED = ("Model has already been wrapped in 'poptorch.trainingModel'. Call model.destroy() "
                   "on the model to unwrap before wrapping again.")
INVALID_BATCH_DIM = (
    "Invalid batch dimension: In the input {name}, the batch dimension ({batch}) must be a multiple of "
    "Options.deviceIterations({di}) * (Options.replicationFactor({rf}) / "
    "Options.inputReplicaGrouping.input_group_size({gs})) * Options.Training.gradientAccumulation({ga}) "
    "= {total} because it is used to calculate the batch size which will be executed on the device in "
    "any given iteration. For a full explanation see the batching semantics page of the documentation.")
INFERENCE_GRAD_ACCUM = (
    "You must set poptorch.Options().Training.gradientAccumulation to 1 or leave it as its default "
    "value (1) when running a poptorch.inferenceModel().")
INFERENCE_GRAD_ACCUM_PIPELINE = (
    " Use poptorch.Options().deviceIterations to process a sufficient number of batches each run for "
    "pipelined execution instead.")
NO_LOSS = "Couldn't find a loss in graph!"
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

# --- options -------------------------------------------------------------------
FROZEN_OPTIONS = "Can't modify frozen Options"

# --- ops -----------------------------------------------------------------------
FOR_LOOP_TRAINING = "poptorch.for_loop() is only supported in inference."
COND_TRAINING = "poptorch.cond() is only supported in inference."
NO_ACTIVE_BLOCK = "No active Block, all the ops must belong to a Block"
