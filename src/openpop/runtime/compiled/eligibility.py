"""Whether the compiled backend can run an executor's model with exactly eager's results.

``static_reasons`` looks at the compiled plan, the options and the optimizer; ``probe`` runs one
micro-batch eagerly (as the compile pass does: no trace left - buffers and RNG restored, nothing
printed) to find what only running shows: host I/O such as ``ipu_print_tensor``, inputs changed in
place, outputs that are not tensors - and what the program must carry: the parameters with
``requires_grad`` that get no gradient (eager's step skips them: the program takes them as
constants, as it does frozen ones), the buffers the forward updates in place (by version counter, and
normalisation statistics, whose kernels do not bump it) or reassigns, and whether it draws random
numbers. Data-dependent Python control flow and unsupported ops are found by
``torch.compile(fullgraph=True)`` itself (``backend.py``).

Block annotations and execution strategies (pipelined, sharded, phased) do not decline a model:
when every virtual IPU maps onto one torch device such a plan computes what the plain forward
computes, so the program runs the whole forward (the annotations do nothing outside the compile
trace). PopTorch's plan checks ran before, at compile. Recomputation is not honoured inside the
program (docs/guides/compiled-backend.md). Plans spanning several devices, and micro-batches on
concurrent threads (``OPENPOP_CONCURRENT_STAGES=on``), decline. Replicas in several processes
(popdist) do not: each unit all-reduces the gradients where eager does (``processes.py``).
"""
import dataclasses

import torch
from torch.utils.hooks import RemovableHandle

from ...enums import OutputMode
from ...torch_compat import NormBase, global_module_hooks, top_saved_tensors_default_hooks
from .. import assigned_slots, context, messages
from ..anchors import GRADIENT
from ..half_compute import LOW_PRECISION
from ..losses import as_scalar
from ..outputs import flatten_output
from ..pipeline import CONCURRENCY_ENV
from ..shapes_only import recorded
from ..weights import BufferSnapshot, NormStatistics
from .compile_cost import OpCounter
from .optimizer_support import unsupported_reason, updated_parameters
from .saved_programs import OpRecorder

# Non-tensor arguments the program takes as constants of its trace (``forward(x, mask=None)``).
# Every later call has equal values: the executor checks them against the compiled signature
# (PopTorch's "Value mismatch") before any backend runs. Other objects may hold tensors the
# program would not see as inputs, so they decline.
CONSTANT_INPUTS = (type(None), bool, int, float, str)


class Ineligible(Exception):
    """The reason, naming the construct, why a model runs eagerly."""


def static_reasons(call, executable):
    """Reasons known without running the model (first one wins)."""
    layout = executable.layout
    settings = call.settings
    precision = call.precision
    half_weights = any(p.dtype in LOW_PRECISION for p in call.model.parameters())
    checks = [
        (layout.multi_device, messages.INELIGIBLE_STAGE_DEVICES.format(
            devices=", ".join(str(d) for d in layout.device_map.distinct_devices(0)))),
        (layout.replicas_apart, "replicas on devices of their own"),
        (layout.concurrent, messages.INELIGIBLE_CONCURRENT_STAGES.format(env=CONCURRENCY_ENV)),
        (executable.track_losses, "a loss that the model does not return as one of its outputs"),
        (precision.fp_exceptions, "Precision.enableFloatingPointExceptions"),
        # The program rounds with numbers drawn before it runs; eager draws none for a step that
        # automatic loss scaling skips. A program running one step at a time (stepwise: every
        # PopTorch model with half weights; or DI 1) puts the generators back after a skipped step;
        # one looping over several steps (PopART's graphs computing in low precision) cannot.
        (precision.stochastic_rounding and call.training and half_weights and precision.dynamic is not None
         and getattr(call.model, "computes_low_precision", False) and call.geometry.device_iterations > 1,
         messages.INELIGIBLE_ROUNDING_SKIPPED_STEPS),
        (any(t.dtype == torch.float64 for t in list(call.model.parameters()) + list(call.model.buffers())),
         "float64 weights or buffers"),
        (OutputMode(settings.output_mode) == OutputMode.EveryN
         and call.geometry.device_iterations % max(1, settings.output_return_period) != 0,
         "OutputMode.EveryN with a period that does not divide deviceIterations"),
    ]
    for failed, reason in checks:
        if failed:
            yield reason
    for module in call.model.modules():
        if module.training and isinstance(module, NormBase) \
                and module.track_running_stats and module.momentum is None:
            yield messages.INELIGIBLE_CUMULATIVE_AVERAGE.format(module=type(module).__name__)
    if call.training:
        reason = unsupported_reason(call.optimizer)
        if reason is not None:
            yield reason
        registered = {id(p) for p in call.model.parameters()}
        if any(id(p) not in registered for g in call.optimizer.param_groups for p in g["params"]):
            yield "optimizer parameters that the model does not register"
    yield from changing_reasons(call)


def changing_reasons(call):
    """Reasons the user can create between host calls: every parameter frozen, a backward hook
    added. (A forward hook added or removed, or some parameters frozen or unfrozen, makes a new
    program: ``HookState``, ``optimizer_support.signature``.)"""
    if call.training and not any(updated_parameters(call.optimizer)):
        yield messages.INELIGIBLE_ALL_FROZEN
    reason = hooks_reason(call.model)
    if reason is not None:
        yield reason


def saved_tensor_hooks_active() -> bool:
    """Whether the caller runs inside ``torch.autograd.graph.saved_tensors_hooks`` (e.g. to measure
    activations): the program keeps no autograd graph for them to see, and ``torch.func.grad``
    refuses to be traced under them (leaving functorch's state broken for the eager run after)."""
    return top_saved_tensors_default_hooks(False) is not None


_TRACED_HOOKS = ("_forward_pre_hooks", "_forward_hooks")  # run by the forward: traced with it
_AUTOGRAD_HOOKS = ("_backward_pre_hooks", "_backward_hooks")  # run by autograd, which a program does not use


def hooks_reason(model):
    """The first module backward hook a user registered, named: a program computes its gradients
    without autograd's hooks. Forward and forward-pre hooks are traced as part of the forward, as
    PopTorch traced them (``forward_hooks``); openpop's own hooks (blocks, BERT's recomputation
    checkpoints) are part of the model too."""
    for kind in _AUTOGRAD_HOOKS:
        if any(not _openpops(h) for h in global_module_hooks(kind).values()):
            return messages.INELIGIBLE_HOOKS.format(kind=kind.strip("_"), module="every module (global)")
    for name, module in model.named_modules():
        for kind in _AUTOGRAD_HOOKS:
            if any(not _openpops(h) for h in getattr(module, kind).values()):
                return messages.INELIGIBLE_HOOKS.format(kind=kind.strip("_"), module=name or "the model")
    return None


def _forward_hook_dicts(model):
    """``(module name, kind, hook dict)`` of every forward(-pre) hook dict, global and on ``model``'s
    modules: what a program traces."""
    for kind in _TRACED_HOOKS:
        yield "every module (global)", kind, global_module_hooks(kind)
    for name, module in model.named_modules():
        for kind in _TRACED_HOOKS:
            yield name or "the model", kind, getattr(module, kind)


def forward_hooks(model) -> tuple:
    """The user's forward and forward-pre hooks, global and on ``model``'s modules, as
    ``(module name, kind, hook)``: what a program traces (its saved key holds them)."""
    return tuple((name, kind, hook) for name, kind, hooks in _forward_hook_dicts(model)
                 for hook in hooks.values() if not _openpops(hook))


class HookState:
    """The forward hooks a program traced, to find at each host call whether they are still the
    same. A hook added always creates a ``RemovableHandle`` (``torch.utils.hooks``), so the
    handles' counter shows additions; a removal (``handle.remove()``, or a deletion from the hook
    dict as ``remove_weight_norm`` does) does not, so the dicts that held the user's hooks are
    kept and their hooks' keys compared (a few dicts: cheap at every call)."""

    def __init__(self, model):
        self.handles = RemovableHandle.next_id
        held = ((hooks, _user_keys(hooks)) for _, _, hooks in _forward_hook_dicts(model) if hooks)
        self._held = [(hooks, keys) for hooks, keys in held if keys]

    def still(self, model) -> bool:
        """Whether no forward hook of the user's was added or removed since (all of ``model``'s
        modules are looked at only when a handle was created since: a handle for another model's
        hook, or a backward hook, leaves this program as it is)."""
        if not all(_user_keys(hooks) == keys for hooks, keys in self._held):
            return False
        if RemovableHandle.next_id == self.handles:
            return True
        current = HookState(model)
        if [(id(h), k) for h, k in current._held] != [(id(h), k) for h, k in self._held]:
            return False
        self.handles = current.handles  # the new handles hooked nothing this program traced
        return True


def _user_keys(hooks) -> tuple:
    return tuple(key for key, hook in hooks.items() if not _openpops(hook))


def _openpops(hook) -> bool:
    return (getattr(hook, "__module__", None) or type(hook).__module__).startswith("openpop.")


def check_static(call, executable):
    for reason in static_reasons(call, executable):
        raise Ineligible(reason)


@dataclasses.dataclass
class Probed:
    """What one eager micro-batch showed."""

    spec: object  # the output's pytree spec
    leaves: list  # (shape, dtype) of each output leaf
    updated_buffers: list  # names of the buffers the forward changes in place (model order)
    draws_random: bool  # the micro-batch advanced a random generator
    assigned: list = dataclasses.field(default_factory=list)  # slots the forward assigns a tensor to
    unused: list = dataclasses.field(default_factory=list)  # names of updated parameters it gives no gradient


def probe(call, micro_args, micro_kwargs, micro_inputs, executable, shapes=None, modes=()):
    """Run one micro-batch eagerly, leaving no trace (``micro_inputs``, name -> tensor, are the
    copies in the arguments), under the dispatch ``modes`` (op counters). ``shapes``: a
    ``shapes_only.ShapesOnly`` whose fake tensors the inputs are - the run computes no values and
    random draws are told by the ops drawing. Returns ``Probed``; raises ``Ineligible``."""
    model = call.model
    versions = {name: tensor._version for name, tensor in micro_inputs.items()}
    buffers = list(model.buffers())
    snapshot = BufferSnapshot(buffers, model)
    rng = torch.random.get_rng_state()
    devices = sorted({t.device.index or 0 for t in buffers + list(model.parameters()) if t.is_cuda})
    cuda_rng = [torch.cuda.get_rng_state(d) for d in devices]
    statistics = NormStatistics()
    assignments = assigned_slots.Recorded(model)
    try:
        with context.running(call.training, tracing=True) as ctx, \
                torch.set_grad_enabled(call.training), statistics, recorded(modes, shapes):
            ctx.compiled = True
            with call.precision.forward(model, tracing=True), assigned_slots.recording(assignments):
                output = model(*micro_args, **micro_kwargs)
            flat, spec = flatten_output(output)
            if call.training:
                params = [p for group in updated_parameters(call.optimizer) for p in group]
                grads = torch.autograd.grad(as_scalar(flat[executable.loss_index]), params, allow_unused=True)
            host_io = getattr(ctx, "host_io", None)
        # (a buffer reassigned in forward is updated too: its registered tensor gets the new value)
        updated = {id(b) for b in snapshot.mutated() + statistics.of(model)}
        updated.update(id(registered) for _, _, registered, _ in snapshot.reassigned())
        replaced = assignments.replaced()
        if shapes is not None:
            draws_random = shapes.draws.drew
        else:
            draws_random = not torch.equal(torch.random.get_rng_state(), rng) or any(
                not torch.equal(torch.cuda.get_rng_state(d), state) for d, state in zip(devices, cuda_rng))
    finally:
        snapshot.restore()
        assignments.restore()
        torch.random.set_rng_state(rng)
        for device, state in zip(devices, cuda_rng):
            torch.cuda.set_rng_state(state, device)
    changed = [name for name, tensor in micro_inputs.items() if tensor._version != versions[name]]
    if changed:  # the program's inputs are split views: eager's write-back to the caller is not traced
        raise Ineligible(messages.INELIGIBLE_INPUT_MUTATED.format(name=changed[0]))
    if host_io is not None:
        raise Ineligible(messages.INELIGIBLE_HOST_IO.format(host_io=host_io))
    if replaced is not None:
        raise Ineligible(messages.INELIGIBLE_ATTRIBUTE_REPLACED.format(name=replaced))
    if not all(isinstance(leaf, torch.Tensor) for leaf in flat):
        raise Ineligible(messages.INELIGIBLE_OUTPUTS)
    unused = []  # (eager's step skips a parameter whose .grad is None: the program holds it constant)
    if call.training:
        names = {id(p): n for n, p in model.named_parameters()}
        unused = [names[id(p)] for p, g in zip(params, grads) if g is None]
    return Probed(spec, [(tuple(leaf.shape), leaf.dtype) for leaf in flat],
                  [name for name, b in model.named_buffers() if id(b) in updated], draws_random,
                  assignments.names(), unused)


def counted_probe(call, inputs, executable, shapes=None, hashed=False):
    """``(Probed, counter, digest)``: the checks and ``probe`` of the call's first micro-batch, its
    aten ops and FLOPs counted (``compile_cost.OpCounter``) and, ``hashed``, hashed (``digest``,
    ``saved_programs.OpRecorder``; else None). ``shapes``: on fake tensors."""
    check_static(call, executable)
    if not all(isinstance(leaf, torch.Tensor) or type(leaf) in CONSTANT_INPUTS for leaf in inputs.leaves):
        raise Ineligible(messages.INELIGIBLE_INPUTS)
    counter = OpCounter()
    recorder = OpRecorder() if hashed else None
    with executable.weights.active():
        (micro_args, micro_kwargs), micro_inputs = first_micro_batch(call, inputs, shapes)
        probed = probe(call, micro_args, micro_kwargs, micro_inputs, executable, shapes,
                       [counter] if recorder is None else [counter, recorder])
    return probed, counter, recorder.digest if recorder is not None else None


def first_micro_batch(call, inputs, shapes=None):
    """``((args, kwargs), {name: tensor})`` of the call's first micro-batch, as copies: a model
    that changes its inputs in place must not change the caller's tensors when probed (``shapes``:
    as its fake tensors, ``shapes_only.ShapesOnly``)."""
    names = {id(tensor): name for name, tensor in inputs.named_tensors()}
    leaves = list(inputs.leaves)
    copies = {}
    for pos in inputs.tensor_positions:
        tensor = leaves[pos]
        micro = tensor if tensor.dim() == 0 else call.geometry.split(tensor)[0, 0, 0]
        with torch.inference_mode(False):  # a normal tensor: its in-place changes are counted
            copy = micro.clone() if shapes is None else shapes.fake(micro)
            leaves[pos] = copies[names.get(id(tensor), f"#{pos}")] = copy
    return inputs.rebuild(leaves), copies


def anchored_in_program(anchors, model, trained_names, training, updated_buffers=()):
    """The anchors whose per-step values the program reports, as ``(anchor, "grad" | "param",
    index in trained_names)``: gradients and (training) the weights the optimizer updates. The
    others - buffers, weights that do not change - the host reads after the call, as eager does.
    Raises ``Ineligible`` for the gradient of a weight outside the optimizer (the program
    computes only the optimizer's gradients) and for a buffer the forward updates anchored in a
    mode other than ``Final`` (its per-step values are not reported)."""
    if not anchors:
        return []
    buffers = dict(model.named_buffers())
    for name in updated_buffers:
        for anchor in anchors.anchors():
            if anchor.tensor is buffers.get(name) and anchor.mode != OutputMode.Final:
                raise Ineligible(messages.INELIGIBLE_ANCHORED_BUFFER.format(name=name))
    if not training:
        return []
    index = {id(p): trained_names.index(n) for n, p in model.named_parameters() if n in trained_names}
    reported = []
    for anchor in anchors.anchors():
        k = index.get(id(anchor.tensor))
        if anchor.kind == GRADIENT and k is None and anchor.tensor.requires_grad:
            names = {id(p): n for n, p in model.named_parameters()}
            raise Ineligible(messages.INELIGIBLE_ANCHORED_GRADIENT.format(name=names.get(id(anchor.tensor), "?")))
        if k is not None:
            reported.append((anchor, "grad" if anchor.kind == GRADIENT else "param", k))
    return reported
