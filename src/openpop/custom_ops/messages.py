"""Texts of ``poptorch.custom_op`` and the custom-op registry (see openpop/errors.py for the rule).

The attribute checks keep PopTorch's words, the Ctc reduction check PopART's.
"""
# --- PopTorch's checks of custom_op's attributes -------------------------------
ATTRIBUTE_KEYS = "All attribute keys must be strings."
ATTRIBUTE_VALUES = "Attribute values must be floats, ints, strings or a list/tuple of float, ints of strings."
ATTRIBUTE_LIST_TYPES = "The types in a list/tuple attribute must all be the same."
ATTRIBUTE_NON_ASCII = "{value} contains non-ASCII characters."

# --- calling -------------------------------------------------------------------
NOT_REGISTERED = (
    "poptorch.custom_op: no implementation of the PopART custom op '{domain}::{name}' is registered "
    "(PopART custom ops are IPU programs: openpop runs a PyTorch implementation in their place). "
    "Register one before the model runs: openpop.register_custom_op('{name}', '{domain}', fn), with "
    "fn(*inputs, **attributes) returning the outputs (a tensor or a list, shaped like example_outputs). "
    "Registered: {known}.")
EXAMPLE_NOT_TENSOR = "poptorch.custom_op '{op}': example_outputs[{index}] must be a torch.Tensor, got {kind}."
OUTPUT_COUNT = ("poptorch.custom_op '{op}': its implementation {fn} returned {got} output(s), example_outputs "
                "holds {expected}.")
OUTPUT_NOT_TENSOR = "poptorch.custom_op '{op}': output {index} of its implementation {fn} is a {kind}, not a tensor."
OUTPUT_SHAPE = ("poptorch.custom_op '{op}': output {index} of its implementation {fn} has shape {got}, "
                "example_outputs[{index}] has shape {expected}.")
EAGER_ONLY = "poptorch.custom_op '{op}', registered eager_only"

# --- registering ---------------------------------------------------------------
REGISTER_NAME = "register_custom_op: {what} must be a non-empty string, got {value!r}."
REGISTER_FN = "register_custom_op: fn must be callable, got {value!r}."
ALREADY_REGISTERED = ("register_custom_op: '{op}' already has an implementation ({fn}); pass replace=True to "
                      "replace it.")
NOT_REGISTERED_TO_REMOVE = "unregister_custom_op: no implementation of '{op}' is registered."

# --- the shipped implementations ------------------------------------------------
REDUCTION = "Unexpected ReductionType string, {value}. Cannot convert to ReductionType"
CTC_LOG_PROBS_SHAPE = ("ai.graphcore::Ctc: log_probs must be [max input length, batch, classes] (rank 3), "
                       "got shape {shape}.")
NMS_SHAPES = ("ai.graphcore::Nms: scores must be [batch, boxes, classes] and boxes [batch, boxes, 4], got "
              "shapes {scores} and {boxes}.")
NMS_DETECTIONS = "ai.graphcore::Nms: numDetections must be a positive integer, got {value!r}."
