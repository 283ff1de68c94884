"""One host call as one compiled program: DI steps x GA x R micro-batches, forward, backward,
gradient reduction, loss scaling, optimizer update and output collection.

The program is a pure function of tensors - parameters, optimizer state, hyperparameters and the
call's inputs split ``[DI, GA, R_in, micro, ...]`` - compiled by ``torch.compile`` (Inductor):

* one optimizer step (``_step``): for each micro-batch ``torch.func.grad`` of
  ``loss * loss_scaling`` through ``torch.func.functional_call`` of the user's module; the
  gradients reduced as the executor does (``gradients.py``: Sum, Mean post hoc or running
  mean) and unscaled; then the functional optimizer update (``functional_optim.py``);
* GA x R > 1: the micro-batches are a ``torch._higher_order_ops.while_loop`` carrying the
  gradients, buffers and outputs (``micro_batches.py``): one forward + backward in the graph
  whatever GA x R, so compile time and memory do not grow with them. Unrolled (traced Python)
  only for forwards under a torch function mode (below);
* DI > 1: ``torch._higher_order_ops.while_loop`` over the steps, the state carried (the
  micro-batch loop nested in its body); gradients are computed *inside* the loop bodies
  (differentiating through ``while_loop`` is not used);
* outputs: every micro-batch's output leaves stacked ``[DI, GA*R, ...]`` (``Final``: only the
  last step's, carried), assembled per output mode as ``outputs.py`` assembles them; the last
  ``micro_batch_leaves`` leaves (a model's ``compiled_micro_batch_leaves()``) are returned for
  every micro-batch whatever the mode, stacked ``[DI*GA*R, ...]`` (Lightning's ``self.log``);
* buffers the forward updates in place or reassigns (BatchNorm running statistics and
  ``num_batches_tracked``, any buffer a forward changes): state of the program. Each micro-batch,
  in eager's order ``[DI, GA, R]``, gets a clone of the current values through
  ``functional_call``, its updates become the next micro-batch's values - as plain values, detached
  from the micro-batch's gradient (``buffer_state.py``: as on an IPU) - carried across device
  iterations; with per-replica buffers (``weights.ReplicaBuffers``) each replica carries its own
  set. A model in ``eval()`` updates nothing (the probe then finds no updated buffer).
* tensors the forward assigns to slots its modules already hold (``self.mask = self.mask.to(...)``
  on an attribute, a parameter or a buffer): passed through ``functional_call``, which undoes
  the assignment when the forward returns, and let past Dynamo's side-effect check inside the
  loops (``assigned_slots.py``);
* random numbers: Inductor's ``fallback_random`` (``backend.py`` sets it when the probe saw the
  model draw) keeps aten's random ops, which draw from torch's global generator at run time -
  inside ``torch.func.grad`` and ``while_loop`` bodies as well - in the program's order, which
  is eager's: micro-batch after micro-batch ``[DI, GA, R]``, nothing drawn in backward or the
  update. So dropout masks equal eager's bit for bit, replicas get different masks (they draw
  one after another from one generator, as eager's replicas do), ``Options.randomSeed`` (which
  seeds torch) makes runs repeat, and the generator ends where eager's would: a later call,
  compiled or eager, continues the same stream. (Without it Inductor generates ``rand``/``randn``
  and, on CUDA, dropout itself from a seed it draws: other numbers. CPU dropout is aten's
  ``bernoulli_`` either way. ``torch._functorch.config.functionalize_rng_ops`` is not used: it
  threads a CUDA philox seed and offset through the graph, i.e. its own numbers too.)
* stochastic rounding of half weights (``Precision.enableStochasticRounding``): the host draws
  each step's uniform numbers from openpop's generators in eager's order
  (``RunPrecision.rounding_noise``), an input ``[DI, *shape]`` per weight (a stepwise program's
  host loop draws step by step: one step's numbers held at a time), and the update rounds
  with them: the weights equal eager's bit for bit when the float32 update does;
* hyperparameters: one tensor (``FunctionalOptimizer.hyper``), per-step ones (``step_hooks.py``)
  ``[values, DI]``, indexed by the step counter;
* CPU attention: aten's flash kernels, but for short sequences the backward is Inductor-fused
  tensor math over the forward's logsumexp (``attention_backward.py``: BERT-base bf16's steps);
* *stepwise* programs (a forward under a torch function mode, ``LowPrecisionOps``, which
  ``while_loop``'s body cannot hold) compile one step, with its micro-batches unrolled, and the
  host loops over the steps;
* loss scaling as program state (``loss_scaling.py``); anchored gradients and weights reported
  per step ``[DI, ...]`` and recorded by the host as eager records them (``anchors.py``);
* replicas in several processes (popdist): each step's summed, loss-scaled gradients are
  all-reduced with the other processes' before they are unscaled, as eager does
  (``processes.py``: torch's functional collectives inside the program).

Nothing the program computes reaches the model, its buffers or the optimizer until it has
finished, and the generators are put back if it raises: a call that raises changes nothing.

Repeated layers (BERT's 12 encoder layers) are inlined: each copy is traced by Dynamo and
lowered by Inductor (which defines, and g++ compiles, identical kernels once: it keys them on
their source). Compiling the repeated layer once inside the program is not possible with torch
2.13 (``benchmarks/bert_regional.py`` checks it): ``torch.compiler.nested_compile_region`` on
the layers' forward compiles forward-only programs, but Dynamo fails on it under
``torch.func.grad`` ("Expected FakeTensor") and inside ``while_loop`` ("Freevar has no
source"), as with ``torch.autograd.grad`` traced in the program; an opaque custom op or
``autograd.Function`` around a separately compiled layer fails under the traced
``torch.func.grad`` too (custom ops' autograd lacks ``setup_context``; Dynamo cannot proxy the
function's context). The alternative, torch's regional compilation (the layer compiled once,
the rest of the host call eager), compiles in about a minute at any depth but was not adopted
as a mode: on CPU the fp32 layer is matmul-bound, so compiling it alone buys little (BERT L2,
CPU time: 1.01x eager fp32, 1.22x bf16), while this program's gain (L12: 1.08-1.19x fp32, 1.05-1.40x
bf16) comes mostly from fusing what surrounds the layers (LAMB over 110 M parameters, gradient
accumulation, the embeddings' backward). README "BERT compiled" has the measurements.
"""
import contextlib
import itertools
import types
import weakref

import torch
from torch.func import functional_call

from ...enums import MeanReductionStrategy, OutputMode, ReductionType
from ...torch_compat import dynamo_config
from .. import assigned_slots, context
from ..gradients import MeanPolicy
from ..losses import as_scalar
from ..outputs import _DEMOTE, _unflatten, flatten_output, protect_output
from . import micro_batches
from .cache_hit import CacheHitCall
from .flat_loop import CarriedState, flat_while_loop
from .flat_operands import flat_operands
from .loss_scaling import ScalingState


class Layout:
    """What a program needs to know of one executor's call (static: a change rebuilds it)."""

    def __init__(self, call, inputs, output_spec, output_leaves, micro_batch_leaves=0):
        settings = call.settings
        geometry = call.geometry
        self.geometry = geometry
        self.training = call.training
        self.chunks = [geometry.input_chunk_of_replica(r) for r in range(geometry.replication_factor)]
        self.inputs = inputs  # BoundInputs template (only its structure is used)
        self.mode = OutputMode(settings.output_mode)
        self.period = settings.output_return_period if self.mode == OutputMode.EveryN else 1
        self.output_spec = output_spec
        self.output_leaves = output_leaves  # (shape, dtype) per leaf of one micro-batch's output
        self.micro_batch_leaves = micro_batch_leaves  # trailing leaves returned per micro-batch
        self.mean = settings.reduction == ReductionType.Mean
        self.running = self.mean and settings.mean_strategy == MeanReductionStrategy.Running

    def keeps_all(self, leaf: int) -> bool:
        return self.mode != OutputMode.Final or leaf >= len(self.output_leaves) - self.micro_batch_leaves


class Program:
    """The compiled function for one call, model, optimizer signature and layout."""

    def __init__(self, model, layout, functional_optimizer, loss_index, trained_names, frozen_names, compile_fn,
                 forward_contexts=(), stepwise=False, scaling=None, anchored=(), buffer_names=(), buffer_sets=1,
                 draws_random=False, all_reduce=None, assigned=(), rounded=()):
        self.model = model
        self.forward_contexts = list(forward_contexts)  # RunPrecision.traced_forward: autocast, half ops
        # A torch function mode among them (LowPrecisionOps) has no place in while_loop's body: pushing
        # it there is a side effect torch.compile refuses, and one pushed outside the program is not
        # applied to the body. Such programs compile one device iteration; the host loops over them.
        self.stepwise = stepwise and layout.geometry.device_iterations > 1
        # The same holds for a while_loop over the micro-batches (micro_batches.py).
        self.loops_micro_batches = not stepwise and layout.geometry.micro_batches_per_step > 1
        self.scaling = scaling if scaling is not None else ScalingState(None, layout.geometry.device_iterations)
        # The anchors (anchors.Anchor) the program reports per step, as ("grad" | "param", index in trained).
        self.anchor_ids = [id(anchor) for anchor, _, _ in anchored]
        self.anchored = [(kind, k) for _, kind, k in anchored]
        self.layout = layout
        self.optim = functional_optimizer
        self.loss_index = loss_index
        self.trained_names = trained_names  # the optimizer's parameters (inference: all)
        self.frozen_names = frozen_names
        self.per_step_hyper = bool(functional_optimizer is not None and functional_optimizer.static[3])
        self.buffer_names = list(buffer_names)  # buffers the forward updates: carried state
        # Slots the forward assigns a tensor to (assigned_slots.py), passed through functional_call:
        # parameters are already, changed buffers are carried (buffer_names); the others keep their tensor.
        passed = {*self.buffer_names, *(n for n, _ in model.named_parameters(remove_duplicate=False))}
        self.assigned = [name for name in assigned if name not in passed]
        modules = dict(model.named_modules(remove_duplicate=False))
        self.assigned_slots = {}
        for name in assigned:
            prefix, _, attribute = name.rpartition(".")
            self.assigned_slots.setdefault(id(modules[prefix]), set()).add(attribute)
        names, shared = _tensor_slots(model)
        self.aliases = _slot_aliases(names, shared)
        # No tensor under several names: functional_call's tying (a walk over every parameter and
        # buffer, traced by Dynamo at each trace) has nothing to tie
        self.untied = not shared and all(len(slots) == 1 for slots in names.values())
        self.buffer_sets = buffer_sets  # R with per-replica buffers, else 1
        self.draws_random = draws_random  # the model draws from torch's generators
        # Indices into trained of the weights rounded stochastically (Precision.enableStochasticRounding):
        # the program takes their uniform numbers as an input, [DI, *shape] each (RunPrecision.rounding_noise).
        self.rounded = list(rounded)
        self.all_reduce = all_reduce  # processes.ProgramAllReduce: popdist's processes (else None)
        self.compiled = False  # torch.compile has compiled it (compile() does, without running it)
        self.ran = False  # a first run that fails is a compile failure (backend.py)
        self.compiler = None  # the torch.compile backend (inductor.ProgramCompiler), set by backend.py
        self.aliased = None  # indices of outputs returned in an input's memory (backend.py)
        self.saved = None  # saved_programs.SavedProgram, with the executable cache on (backend.py)
        traced = _own_code(self._one_step if self.stepwise else self._rounding_program if self.rounded
                           else self._program)
        self._compiled = CacheHitCall(traced, compile_fn(traced),  # torch.compile's function, called cheaply
                                      lambda: _traced_by_dynamo(layout.training))

    # ------------------------------------------------------------------ host side
    def run(self, inputs, trained, frozen, buffers, state, hyper, scaling, noise=None):
        """Run the program; ``inputs``: the call's tensors (``ProgramArguments.tensors``, viewed
        ``[DI, GA, R_in, micro, ...]`` inside the program: a view made per call costs microseconds);
        ``buffers``: the updated buffers' values, replica set after replica set; ``scaling``:
        ``ScalingState.inputs``; ``noise``: ``draw(steps)``, per ``rounded`` weight its rounding
        numbers for the next ``steps`` steps (``RunPrecision.rounding_draws``), or None. Returns
        (new_params, new_state, new_buffers, outputs, scaling, anchored: per ``self.anchored``
        entry its values ``[DI, ...]``) - nothing committed."""
        if self.assigned_slots:  # (no context per call for the others: the host call's hot path)
            # Traced once (assigned_slots.py): a retrace fails as past the recompile limit.
            with assigned_slots.scoped(self.assigned_slots), dynamo_config.patch(recompile_limit=1):
                return self._run(inputs, trained, frozen, buffers, state, hyper, scaling, noise)
        return self._run(inputs, trained, frozen, buffers, state, hyper, scaling, noise)

    def _run(self, inputs, trained, frozen, buffers, state, hyper, scaling, noise):
        if self.stepwise:
            return self._run_stepwise(self._split(inputs), trained, frozen, buffers, state, hyper, scaling, noise)
        if self.rounded:
            steps = self.layout.geometry.device_iterations
            mark = noise.mark() if self.scaling.automatic else None  # (then DI is 1: eligibility.py)
            result = self._compiled(tuple(inputs), tuple(trained), tuple(frozen), tuple(buffers), state, hyper,
                                    scaling, tuple(noise(steps)))
            if mark is not None and not bool(result[4]["history"][0]):  # skipped: eager draws nothing for it
                noise.undo(mark)
            return result
        return self._compiled(tuple(inputs), tuple(trained), tuple(frozen), tuple(buffers), state, hyper, scaling)

    def _split(self, inputs):
        """The batched inputs viewed ``[DI, GA, R_in, micro, ...]`` (0-d ones as they are)."""
        return [x if x.dim() == 0 else self.layout.geometry.split(x) for x in inputs]

    def _run_stepwise(self, split_inputs, trained, frozen, buffers, state, hyper, scaling, noise):
        steps = self.layout.geometry.device_iterations
        keep_all = [self.layout.keeps_all(leaf) for leaf in range(len(self.layout.output_leaves))]
        kept, anchored = [], []
        device = next((x.device for x in split_inputs), torch.device("cpu"))
        # Every step takes plain tensors, as the steps after the first do (the previous step's results):
        # Parameters for the first would be another type to Dynamo's guards, and a second trace.
        trained = [p.detach() for p in trained]
        undo = noise is not None and self.scaling.automatic
        for i in range(steps):
            step_inputs = tuple(x if x.dim() == 0 else x[i] for x in split_inputs)
            index = torch.tensor([i], device=device)  # an input: the same program serves every step
            mark = noise.mark() if undo else None
            trained, state, buffers, outs, scaling, values = self._compiled(
                step_inputs, tuple(trained), tuple(frozen), tuple(buffers), state, self._hyper_row(hyper, i), scaling,
                index, () if noise is None else tuple(n[0] for n in noise(1)))
            if undo and not bool(scaling["history"][i]):  # skipped: eager draws nothing for it
                noise.undo(mark)
            kept.append(outs)
            anchored.append(values)
        stacked = [torch.stack(leaf) if keep else leaf[-1].unsqueeze(0) for leaf, keep in zip(zip(*kept), keep_all)]
        anchored = [torch.stack(values) for values in zip(*anchored)]
        return trained, state, list(buffers), self._assemble(stacked), scaling, anchored

    def record_anchors(self, anchors, anchored) -> None:
        """Hand the call's anchored values to ``anchors`` step by step, as eager records them
        (``anchors.py``: each anchor keeps what its output mode returns); anchors the program does
        not report (buffers, weights it does not train) read the tensor as eager does."""
        steps = self.layout.geometry.device_iterations
        per_anchor = dict(zip(self.anchor_ids, anchored))
        anchors.start_call()
        for step in range(steps):
            for anchor in anchors.anchors():
                values = per_anchor.get(id(anchor))
                anchor.record(step, step == steps - 1, None if values is None else (lambda v=values[step]: v))
        anchors.finish_call()

    def finish(self, rows):
        """The host call's result from the program's assembled leaves (dtypes as PopTorch returns)."""
        rows = [out if out.is_cpu else out.cpu() for out in rows]  # one device-to-host copy per output, as eager
        leaves = [protect_output(out.to(_DEMOTE[out.dtype]) if out.dtype in _DEMOTE else out) for out in rows]
        return _unflatten(leaves, self.layout.output_spec)

    def _assemble(self, stacked):
        """Per leaf ``[DI, GA*R, ...]`` -> the rows the output mode returns, shaped as
        ``OutputCollector`` shapes them (traced: part of the program)."""
        layout = self.layout
        g = layout.geometry
        replicas, accumulation = g.replication_factor, g.gradient_accumulation
        leaves = []
        for leaf, values in enumerate(stacked):
            leaf_shape = values.shape[2:]
            if leaf >= len(stacked) - layout.micro_batch_leaves:
                leaves.append(values.reshape(-1, *leaf_shape).clone())
                continue
            if layout.mode == OutputMode.Final:
                rows = values[-1].reshape(accumulation, replicas, *leaf_shape)[-1]
            elif layout.mode == OutputMode.Sum:
                rows = values.reshape(-1, accumulation, replicas, *leaf_shape).sum(dim=(0, 1))
            elif layout.mode == OutputMode.EveryN:
                rows = values[layout.period - 1::layout.period].reshape(-1, *leaf_shape)
            else:
                rows = values.reshape(-1, *leaf_shape)
            if rows.shape[0] == 1:
                out = rows[0].clone()
            elif len(leaf_shape) == 0:
                out = rows.clone()
            else:
                out = rows.reshape(-1, *leaf_shape[1:]).clone()
            leaves.append(out)
        return leaves

    # ------------------------------------------------------------------ traced
    def _program(self, inputs, trained, frozen, buffers, state, hyper, scaling):
        return self._steps(inputs, trained, frozen, buffers, state, hyper, scaling, ())

    def _rounding_program(self, inputs, trained, frozen, buffers, state, hyper, scaling, noise):
        """``_program`` with stochastic rounding's numbers (an input only of such programs: each
        input costs every host call its guards)."""
        return self._steps(inputs, trained, frozen, buffers, state, hyper, scaling, noise)

    def _steps(self, inputs, trained, frozen, buffers, state, hyper, scaling, noise):
        split_inputs = self._split(inputs)
        layout = self.layout
        steps = layout.geometry.device_iterations
        keep_all = [layout.keeps_all(leaf) for leaf in range(len(layout.output_leaves))]
        buffers = list(buffers)
        device = next((x.device for x in split_inputs), torch.device("cpu"))
        if steps == 1:
            trained, state, buffers, outs, scaling, values = self._step(
                [x if x.dim() == 0 else x[0] for x in split_inputs], trained, frozen, buffers, state,
                self._hyper_at(hyper, 0), scaling, torch.zeros(1, dtype=torch.int64, device=device),
                [n[0] for n in noise])
            return (trained, state, buffers, self._assemble([o.unsqueeze(0) for o in outs]), scaling,
                    [v.unsqueeze(0) for v in values])

        fixed_scaling = scaling  # static loss scaling is read, not carried (no aliasing in while_loop)
        if not self.scaling.automatic:
            scaling = {}
        carried_state = CarriedState(state, scaling)
        flat_state = carried_state.flatten(state, scaling)
        micro_count = layout.geometry.micro_batches_per_step
        shapes = [(micro_count, *shape) for shape, _ in layout.output_leaves]
        dtypes = [dtype for _, dtype in layout.output_leaves]
        outs0 = [torch.zeros((steps, *s) if keep else s, dtype=d, device=device)
                 for s, d, keep in zip(shapes, dtypes, keep_all)]
        outs0 += [torch.zeros((steps, *trained[k].shape), dtype=trained[k].dtype, device=device)
                  for _, k in self.anchored]  # every step's anchored values
        n_outs = len(shapes)
        fixed = list(trained)  # inference: the weights are read, not carried (no aliasing in while_loop)
        if not layout.training:
            trained = []
        n_trained, n_state, n_buffers = len(trained), len(flat_state), len(buffers)

        def cond(i, *carried):
            return i < steps

        def body(i, *carried):
            params = list(carried[:n_trained]) if layout.training else fixed
            st, sc = carried_state.unflatten(carried[n_trained:n_trained + n_state])
            bufs = list(carried[n_trained + n_state:n_trained + n_state + n_buffers])
            outs = list(carried[n_trained + n_state + n_buffers:])
            outs, anchored = outs[:n_outs], outs[n_outs:]
            index = i.reshape(1)
            step_inputs = [x if x.dim() == 0 else x.index_select(0, index)[0] for x in split_inputs]
            params, st, bufs, step_outs, sc, values = self._step(
                step_inputs, params, frozen, bufs, st, self._hyper_at(hyper, index),
                sc if self.scaling.automatic else fixed_scaling, index, [n.index_select(0, index)[0] for n in noise])
            if not self.scaling.automatic:
                sc = {}
            outs = [o.index_copy(0, index, s.unsqueeze(0)) if keep else s.clone()
                    for o, s, keep in zip(outs, step_outs, keep_all)]
            outs += [a.index_copy(0, index, v.unsqueeze(0)) for a, v in zip(anchored, values)]
            carried_params = params if layout.training else []
            return (i + 1, *carried_params, *carried_state.flatten(st, sc), *bufs, *outs)

        result = flat_while_loop(cond, body, (torch.tensor(0, device=outs0[0].device), *trained, *flat_state,
                                              *buffers, *outs0))
        trained = list(result[1:1 + n_trained])
        state, scaling = carried_state.unflatten(result[1 + n_trained:1 + n_trained + n_state])
        buffers = list(result[1 + n_trained + n_state:1 + n_trained + n_state + n_buffers])
        outs = list(result[1 + n_trained + n_state + n_buffers:])
        outs, anchored = outs[:n_outs], outs[n_outs:]
        outs = [o if keep else o.unsqueeze(0) for o, keep in zip(outs, keep_all)]
        return (trained, state, buffers, self._assemble(outs), scaling if self.scaling.automatic else fixed_scaling,
                anchored)

    def _one_step(self, step_inputs, trained, frozen, buffers, state, hyper, scaling, index, noise):
        """One device iteration as a program of its own (``stepwise``; ``hyper``, ``noise``: the step's rows)."""
        hyper = hyper if self.optim is None else self.optim.unpack(hyper)
        return self._step(list(step_inputs), list(trained), frozen, list(buffers), state, hyper, scaling, index,
                          list(noise))

    def _hyper_row(self, hyper, index):
        """Step ``index``'s hyperparameters as ``FunctionalOptimizer.hyper()`` gives them (per-step
        ones are a ``[values, steps]`` tensor; inference has none: ``[]``)."""
        if not self.per_step_hyper:
            return hyper
        if isinstance(index, int):
            return hyper[:, index]
        return hyper.index_select(1, index)[:, 0]

    def _hyper_at(self, hyper, index):
        """Step ``index``'s hyperparameters per group ``{name: 0-d tensor}`` (traced)."""
        row = self._hyper_row(hyper, index)
        return row if self.optim is None else self.optim.unpack(row)

    def _forward(self, params, buffers, micro_inputs):
        """One micro-batch's output leaves and the values of the updated buffers after it (the
        module updates clones: program inputs and carried values are never changed in place)."""
        leaves = list(self.layout.inputs.leaves)
        for pos, value in zip(self.layout.inputs.tensor_positions, micro_inputs):
            leaves[pos] = value
        args, kwargs = self.layout.inputs.rebuild(leaves)
        tensors = {**params, **dict(zip(self.buffer_names, (b.clone() for b in buffers)))}
        for name in self.assigned:  # the tensor the slot holds, the same after the call
            tensors[name] = _slot(self.model, name)
        if self.aliases is None:
            call = _untied_call if self.untied else functional_call
            output = _within(self.forward_contexts, call, self.model, tensors, args, kwargs)
        else:  # a module under several names: each slot given once, its other slots named (_slot_aliases)
            for name, others in self.aliases.items():
                if name in tensors:
                    tensors.update(dict.fromkeys(others, tensors[name]))
            output = _within(self.forward_contexts, _untied_call, self.model, tensors, args, kwargs)
        # functional_call writes back what the module's slots hold after the call: a buffer the
        # forward reassigned (``self.buf = new``) is its new tensor there
        return flatten_output(output)[0], [tensors[name] for name in self.buffer_names]

    def micro_batch(self, params, buffers, micro_inputs, loss_scale):
        """One micro-batch: (its scaled gradients, ``None`` in inference; its output leaves; the
        updated buffers' values). ``params``: every weight by name."""
        if not self.layout.training:
            flat, buffers = self._forward(params, buffers, micro_inputs)
            return None, flat, buffers

        def scaled_loss(trained, bufs):
            flat, bufs = self._forward({**params, **dict(zip(self.trained_names, trained))}, bufs, micro_inputs)
            return as_scalar(flat[self.loss_index]) * loss_scale, ([leaf.detach() for leaf in flat],
                                                                   [b.detach() for b in bufs])

        # The buffers are an argument (not differentiated) so that grad's level wraps them.
        trained = [params[name] for name in self.trained_names]
        grads, (flat, buffers) = torch.func.grad(scaled_loss, has_aux=True)(trained, list(buffers))
        return grads, flat, buffers

    def _step(self, step_inputs, trained, frozen, buffers, state, hyper, scaling, index, noise):
        """One device iteration (``index``: which, a 1-element tensor; ``noise``: its rounding
        numbers): every micro-batch (``micro_batches.py``), then (training) the update. Returns
        (params, state, buffers, stacked outputs, scaling, anchored values)."""
        layout = self.layout
        loss_scale = scaling["scale"]
        g = layout.geometry
        params = {**dict(zip(self.frozen_names, frozen)), **dict(zip(self.trained_names, trained))}
        n = len(self.buffer_names)
        sets = [buffers[k * n:(k + 1) * n] for k in range(self.buffer_sets)]
        run = micro_batches.looped if self.loops_micro_batches else micro_batches.unrolled
        grads, stacked, sets = run(self, step_inputs, params, sets, loss_scale)
        buffers = [b for values in sets for b in values]
        if not layout.training:
            return trained, state, buffers, stacked, scaling, []
        if self.all_reduce is not None:  # the other processes' gradients, still loss-scaled (processes.py)
            grads = self.all_reduce(grads)
        divisor = MeanPolicy.unfolded(layout.mean, layout.running).divisor(loss_scale, g.micro_batches_per_step)
        unscaled = [gr * (1.0 / divisor) for gr in grads]  # as eager unscales (gradients.py)
        new = self.optim.update(list(trained), unscaled, state, hyper, dict(zip(self.rounded, noise)))
        (new_params, new_state), scaling = self.scaling.apply(scaling, grads, (list(trained), state), new, index)
        values = [unscaled[k] if kind == "grad" else new_params[k] for kind, k in self.anchored]
        return new_params, new_state, buffers, stacked, scaling, values


@contextlib.contextmanager
def _traced_by_dynamo(training):
    """A call through Dynamo (which may trace): the run context, flat loop operands (``flat_operands``)."""
    with context.running(training), flat_operands():
        yield


def _slot(model, name):
    """What ``model``'s slot ``name`` (``"block.attn_mask"``) holds, read attribute by attribute
    (traced: the tensor's guards are the model's)."""
    for part in name.split("."):
        model = getattr(model, part)
    return model


def _tensor_slots(model):
    """Per parameter or buffer of ``model`` (by id), its names, one per slot, in
    ``named_parameters``/``named_buffers`` order; and whether a slot is reached under several
    names (a module under two names)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    slots, shared = set(), False
    names = {}
    for table in (model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False)):
        for name, tensor in table:
            prefix, _, attribute = name.rpartition(".")
            slot = (id(modules[prefix]), attribute)
            if slot in slots:
                shared = True
                continue
            slots.add(slot)
            names.setdefault(id(tensor), []).append(name)
    return names, shared


def _slot_aliases(names, shared):
    """None when every parameter and buffer slot is reached under one name (``_tensor_slots``); else
    ``{name: [other names]}``: per tensor (by its ``named_parameters``/``named_buffers`` name), the
    names of its other slots, one name per slot.

    ``functional_call`` ties names by tensor (``tie_weights``): for a module reached under two
    names (``self.second = self.first``) it sets the one slot twice and, undoing both in order,
    leaves the second setting - the traced forward's input - in it: a buffer such a module
    updates escaped the program ("Cannot access storage of TensorWrapper"). Given each slot once,
    untied, it puts every slot back; tensors held by several modules (tied embeddings) are given
    under each of their slots."""
    if not shared:
        return None
    return {first: others for first, *others in names.values()}


def _untied_call(model, tensors, args, kwargs):
    return functional_call(model, tensors, args, kwargs, tie_weights=False)


def _within(contexts, fn, *args):
    """``fn(*args)`` inside the contexts the factories ``contexts`` make, outermost first (the
    forward's precision contexts), backward outside them as eager."""
    if not contexts:
        return fn(*args)
    with contexts[0]():
        return _within(contexts[1:], fn, *args)


_programs = itertools.count()


def _own_code(method):
    """``method`` with a code object of its own: torch.compile keeps its compiled graphs (and
    its recompile limit) per code object, so programs of different executors must not share one.

    Torch's caches assume long-lived code (a module's functions); a program's code dies with the
    program, so what torch keeps for it is released then (``_forget_compiled``), and the function
    gets globals of its own (a copy of this module's): Dynamo installs each compiled graph
    (``__compiled_fn_<n>``) as a global of the traced frame, where this module's dict would keep
    every program of the process."""
    code = method.__func__.__code__
    function = types.FunctionType(code.replace(co_name=f"{code.co_name}_{next(_programs)}"),
                                  dict(method.__func__.__globals__))
    finalizer = weakref.finalize(method.__self__, _forget_compiled, function.__code__)
    finalizer.atexit = False
    return types.MethodType(function, method.__self__)


def _forget_compiled(code) -> None:
    """Release what torch.compile keeps for a dead program's ``code``: Dynamo's cache entries,
    which it stores on the code object itself and which refer back to it (never collected), and
    the guard managers that its ``weakref.finalize`` calls, one per object a guard checks the
    identity of (modules, classes, functions: objects that live as long as the process), keep
    alive to invalidate the entry they belonged to. Without this a small MLP's program kept
    ~1.3 MB and ~3 900 objects after its model was gone (``tests/test_soak.py``). What torch
    keeps beyond (Inductor's loaded kernel modules, a bounded cache of decoded bytecode) stays."""
    try:
        from ...torch_compat import debug_get_cache_entry_list as _debug_get_cache_entry_list
        from ...torch_compat import remove_from_cache
        managers = {id(entry.guard_manager) for entry in _debug_get_cache_entry_list(code)}
        remove_from_cache(code)
        for finalizer, info in list(weakref.finalize._registry.items()):
            invalidate = getattr(info.func, "func", None)  # functools.partial(manager.invalidate, ...)
            if (getattr(invalidate, "__name__", None) == "invalidate"
                    and id(getattr(getattr(invalidate, "__self__", None), "guard_manager", None)) in managers):
                finalizer.detach()
    except Exception:  # torch moved these, or the interpreter is shutting down: keep them
        pass
