"""``SessionOptions.automaticLossScalingSettings``: the checks PopART's AutomaticLossScale transform makes
when a session is built (its errors, in its order).

openpop does not adjust the loss scale while training (PopART's histogram-driven update of the
optimizer's loss scaling): a session with automatic loss scaling enabled trains with the optimizer's
loss scaling, fixed. What PopART rejects is rejected the same way: an inference session, a constant
loss scaling, pipelining without gradient accumulation, ``toTrackTensors`` that contradict the tracking
method, bin edge or threshold outside [0, 1], and a model with no float16 gradient to track.
"""
from . import messages
from .enums import GradientTensorTrackingMethod
from .errors import popart_exception

_CONV_AND_MATMUL = ("MatMul", "Conv", "Gemm", "ConvTranspose")
_VIEW_CHANGING = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Concat", "Split",
                  "Identity", "Expand", "Gather")


def check(settings, *, training: bool, optimizer, options, program, infos) -> None:
    """Raise PopART's error for automatic loss scaling ``settings`` this session cannot have."""
    if not settings.enabled:
        return
    if not training:
        raise popart_exception(messages.ALS_NOT_TRAINING)
    if optimizer is not None and optimizer._defaults["lossScaling"][1]:
        raise popart_exception(messages.ALS_CONST_LOSS_SCALING)
    if options.enablePipelining and not options.enableGradientAccumulation:
        raise popart_exception(messages.ALS_CONTINUOUS_PIPELINING)
    method = GradientTensorTrackingMethod(int(settings.gradientTensorTrackingMethod))
    user = GradientTensorTrackingMethod.GradientsOfUserSpecifiedTensors
    if settings.toTrackTensors is not None and method != user:
        raise popart_exception(messages.ALS_TO_TRACK_WITHOUT_METHOD)
    if method == user and settings.toTrackTensors is None:
        raise popart_exception(messages.ALS_METHOD_WITHOUT_TO_TRACK)
    if method != user and not _tracked(program, infos, method):
        raise popart_exception(messages.ALS_NO_TRACKED_TENSORS)
    if not 0 <= settings.binEdgeLocation <= 1:
        raise popart_exception(messages.ALS_BIN_EDGE_RANGE.format(value=settings.binEdgeLocation))
    if not 0 <= settings.thresholdUpperCountProportion <= 1:
        raise popart_exception(messages.ALS_THRESHOLD_RANGE.format(value=settings.thresholdUpperCountProportion))


def _tracked(program, infos, method) -> bool:
    """Whether backpropagation produces a float16 gradient PopART's tracking method would watch: the
    gradient of a float16 input of a MatMul/Conv (ConvAndMatmulGradients), or of any op that does not
    only change a view (AllNonViewChangingGradientTensors), for inputs a weight's gradient flows through."""
    needs_grad = set(program.trainable_initializers())
    for inputs, outputs in zip(program.node_inputs, program.node_outputs):
        if any(i in needs_grad for i in inputs):
            needs_grad.update(o for o in outputs if o)
    for node, inputs in zip(program.nodes, program.node_inputs):
        watched = node.op_type in _CONV_AND_MATMUL if method == GradientTensorTrackingMethod.ConvAndMatmulGradients \
            else node.op_type not in _VIEW_CHANGING
        if not watched:
            continue
        for name in inputs:
            if name in needs_grad and name in infos and infos[name].data_type() == "FLOAT16":
                return True
    return False
