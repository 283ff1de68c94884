"""The texts of ``poptorch.optim``'s errors and warnings (PopTorch's exact words where it had them)."""

# --- _base ----------------------------------------------------------------------
ACCUM_TYPE_ERROR = "Accumulation types must be either torch.float32 or torch.float16"
AMSGRAD_ERROR = "Only non-amsgrad Adam/AdamW optimizers are supported."
UNKNOWN_VARIABLE_ATTRIBUTE = "Unknown attribute {attr}, allowed values: {allowed_attributes}"
NO_SPARSE_GRADIENTS = "{self_type} does not support sparse gradients"

# --- checks ---------------------------------------------------------------------
SUPPORTED_TYPES = ["torch.optim.SGD", "torch.optim.Adam", "torch.optim.AdamW", "torch.optim.RMSprop",
                   "poptorch.optim.SGD", "poptorch.optim.Adam", "poptorch.optim.AdamW",
                   "poptorch.optim.RMSprop", "poptorch.optim.LAMB"]
SUBCLASS_WARNING = (
    "Optimizer `{name}` subclassed from classes in poptorch.optim or torch.optim are unlikely to behave "
    "as intended. Poptorch does not run Python optimizer code directly; but instead uses IPU native "
    "optimisers implemented in PopART.")
FOREIGN_PARAMETERS = (
    "The optimizer holds {count} tensor(s) that are not parameters of the model: {names}. A poptorch "
    "model trains only its own parameters, so these would never be updated: build the optimizer from "
    "this model's parameters (e.g. torch.optim.SGD(model.parameters(), lr=...)) before wrapping it or "
    "passing it to setOptimizer().")
CONSTANT_ATTRIBUTE_CHANGED = (
    "setOptimizer() cannot change optimizer attributes that were constant when the model was compiled: "
    "{changes}. An attribute is constant unless it was passed explicitly to the optimizer's constructor "
    "(lr is always variable). To change {it}, either mark {it} as variable before the model is compiled "
    "- pass {it} explicitly to the optimizer's constructor or call "
    "optimizer.variable_attrs.markAsVariable({names}) - or call destroy() on the model and run it again "
    "to recompile it with the new values.")
UNSUPPORTED_OPTIMIZER = (
    "Unsupported optimizer type. Types supported {supported} (got {module}.{qualname}). openpop also "
    "runs any other torch.optim optimizer whose step() needs no closure; LBFGS re-evaluates the model in "
    "step() and cannot be driven by a PopTorch model.")
TF_VARIANT_NOT_RMSPROP = "use_tf_variant is only available with RMSProp optimizers."
ACCUM_TYPE_VALUE = "{name} must be set to either torch.float16 or torch.float32 not {value}"

# --- sgd ------------------------------------------------------------------------
VELOCITY_SCALING_IGNORED = (
    "velocity_scaling value ignored when using the separate variant (use_combined_accum=False). "
    "In future, this will lead to an error. Please update your code.")

# --- lamb -----------------------------------------------------------------------
INVALID_LEARNING_RATE = "Invalid learning rate: {lr}"
INVALID_EPSILON = "Invalid epsilon value: {eps}"
INVALID_WEIGHT_DECAY = "Invalid weight_decay value: {weight_decay}"
INVALID_BETA = "Invalid beta parameter at index {i}: {beta}"
