"""The ONNX ``ModelProto`` as a ``torch.nn.Module``: initializers become Parameters (trainable
float weights) or buffers (integer constants, BatchNorm statistics), nodes run in topological
order through the op table.

The nodes are cut into *segments*, one per pipeline stage / virtual graph run (see
``placement.py``); each segment is a sub-module that the session turns into an openpop block
(``poptorch.BeginBlock``), so PopTorch's plan places and schedules it.

The root ``forward(micro_batch_index, *inputs)`` receives one micro-batch per call (the runtime
splits the host buffers), returns the loss marked with ``identity_loss`` (training) followed by
the activations anchored in the ``DataFlow``, each with a leading dimension of 1 so the runtime
stacks them in ``[batchesPerStep, accumulation, replica]`` order. Gradients of anchored tensors
are caught by ``GradientTap`` nodes in backward and recorded per micro-batch index.
"""
from collections import defaultdict
from collections.abc import Sequence
from typing import Optional

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..runtime.half_compute import CONVOLUTION, MATMUL, HalfComputePolicy
from ..runtime.losses import identity_loss  # openpop's loss marker
from . import external_data, fusion, messages, tensorinfo
from . import recompute as recompute_module
from .enums import RecomputationType
from .errors import popart_exception
from .ops import node_attributes, registry, run_node, unsupported_message
from .ops.control import free_variables
from .shapes import info_of, node_label


class NodeView:
    """What an op implementation reads of its node (``ctx.node``), in plain Python: a protobuf
    container in ``forward`` is something torch.compile cannot trace ("Dynamo does not yet
    support subscripting 'RepeatedScalarContainer'"). Nodes with body graphs (If, Loop, Scan)
    keep their ``NodeProto``: their implementations interpret the bodies."""

    __slots__ = ("domain", "input", "name", "op_type", "output")

    def __init__(self, node):
        self.name, self.op_type, self.domain = node.name, node.op_type, node.domain
        self.input, self.output = tuple(node.input), tuple(node.output)


def _has_body(node) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


class GraphProgram:
    """What the interpreter needs from a ``ModelProto``, checked once: supported ops, topological
    order, tensor types."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.opsets = {registry._canon(o.domain): o.version for o in model.opset_import}
        self.opsets.setdefault(registry.ONNX_DOMAIN, 10)
        self.opsets.setdefault(registry.GRAPHCORE_DOMAIN, 1)
        self.initializers: dict[str, np.ndarray] = {i.name: _initializer_array(i) for i in graph.initializer}
        self.input_ids: list[str] = [v.name for v in graph.input if v.name not in self.initializers]
        self.output_ids: list[str] = [v.name for v in graph.output]
        self.nodes = _topological(graph)
        self.producer = {out: node for node in self.nodes for out in node.output if out}
        # Each node's inputs, then the enclosing-scope tensors its If/Loop/Scan bodies read.
        self.node_inputs = [tuple(inputs_of(node)) for node in self.nodes]
        self.node_outputs = [tuple(node.output) for node in self.nodes]
        self.attrs = [node_attributes(node) for node in self.nodes]
        self.input_types = {v.name: v.type for v in graph.input}

    def check_supported(self) -> None:
        for node in self.nodes:
            entry = registry.lookup(node.domain, node.op_type)
            if entry is None:
                raise popart_exception(unsupported_message(node, self.opset_of(node)))

    def opset_of(self, node) -> int:
        return self.opsets.get(registry._canon(node.domain), 1)

    def tensor_ids(self) -> set:
        ids = set(self.initializers) | set(self.input_ids)
        ids.update(out for node in self.nodes for out in node.output if out)
        return ids

    def consumers(self) -> dict[str, list[tuple]]:
        users = defaultdict(list)
        for node, inputs in zip(self.nodes, self.node_inputs):
            for index, name in enumerate(inputs):
                if name:
                    users[name].append((node, index))
        return users

    def trainable_initializers(self) -> list[str]:
        """Float initializers a gradient can reach: not BatchNorm statistics, not only shapes."""
        users = self.consumers()
        trainable = []
        for name, value in self.initializers.items():
            if value.dtype not in (np.float32, np.float16, np.float64):
                continue
            uses = users.get(name, [])
            differentiable = False
            for node, index in uses:
                entry = registry.lookup(node.domain, node.op_type)
                if entry is None:
                    continue
                if index in entry.updated_inputs:
                    differentiable = False
                    break
                if entry.differentiable and index not in entry.non_differentiable_inputs:
                    differentiable = True
            if differentiable:
                trainable.append(name)
        return trainable

    def input_info(self, tensor_id: str) -> tensorinfo.TensorInfo:
        info = info_of(self.input_types[tensor_id])
        if info is None:
            raise popart_exception(messages.INPUT_TENSOR_HAS_NO_COMPLETE_SHAPE.format(tensor_id=tensor_id))
        return info


def _initializer_array(init: onnx.TensorProto) -> np.ndarray:
    """An initializer's values; PopART's error where its data does not fit its type and shape."""
    try:
        return external_data.to_array(init)
    except (TypeError, ValueError, KeyError) as exc:  # KeyError: a data type ONNX does not have
        raise popart_exception(messages.INITIALIZER_UNREADABLE.format(
            name=init.name, data_type=onnx.TensorProto.DataType.Name(init.data_type)
            if init.data_type in onnx.TensorProto.DataType.values() else init.data_type,
            dims=list(init.dims), exc=exc)) from None


def inputs_of(node) -> list[str]:
    """``node``'s inputs followed by the enclosing-scope tensors its body graphs read."""
    free = free_variables(node)
    return list(node.input) + free if free else list(node.input)


def _topological(graph) -> list[onnx.NodeProto]:
    """The nodes in an order where every input is produced before it is used (ONNX requires
    sorted graphs; exported files sometimes are not)."""
    available = {v.name for v in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        rest = []
        for node in pending:
            if all(i in available for i in inputs_of(node)):
                ordered.append(node)
                available.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            node = rest[0]
            missing = [i for i in inputs_of(node) if i not in available]
            raise popart_exception(messages.INPUT_NOT_PRODUCED.format(
                node=node_label(node), missing=missing[0]))
        pending = rest
    return ordered


# Half-precision graphs (float16/bfloat16 initializers) made only of these ops apply the runtime's
# half-precision rules themselves (``runtime/half_compute.py``), per ONNX op rather than per torch
# op: the matmul and convolution families compute on float32 copies of all-half operands where
# this CPU's half GEMMs/convolutions are slow (the result rounded back once: half operands, float32
# accumulation, half result, as an IPU) and in float32 when their operands mix float32 and half;
# the other ops have half kernels and keep torch's promotion. The runtime then runs the graph
# without its torch function mode (``computes_low_precision``), and a compiled program loops over
# the steps inside the program instead of one program call per step. Graphs with other ops keep
# the mode.
_HALF_FAMILIES = {("ai.onnx", "MatMul"): MATMUL, ("ai.onnx", "Gemm"): MATMUL, ("ai.onnx", "Conv"): CONVOLUTION}
_HALF_KERNELS = {("ai.onnx", op) for op in (
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt",
    "Pow", "Erf", "Softmax", "LogSoftmax", "Identity", "Cast", "Reshape", "Flatten", "Transpose", "Squeeze",
    "Unsqueeze", "Concat", "Slice", "Gather", "Shape", "Constant", "ReduceSum", "ReduceMean", "ReduceMax",
    "Max", "Min", "Clip", "Where", "Equal", "Less", "Greater", "Dropout")} | {
    ("ai.graphcore", op) for op in ("Nll", "Gelu", "IdentityLoss", "L1")}


def _half_rules(program: GraphProgram):
    """``{half dtype: its matmul/convolution families that are slow on this CPU}`` when the graph
    applies the half-precision rules itself (see above), else None."""
    half = {torch.float16: np.float16}
    dtypes = {dtype for dtype, np_dtype in half.items()
              if any(v.dtype == np_dtype for v in program.initializers.values())}
    if not dtypes:
        return None
    for node in program.nodes:
        key = (registry._canon(node.domain), node.op_type)
        if key not in _HALF_FAMILIES and key not in _HALF_KERNELS:
            return None
    policy = HalfComputePolicy.from_env()
    return {dtype: {family for family in (MATMUL, CONVOLUTION) if not policy.native("cpu", dtype, family)}
            for dtype in (torch.float16, torch.bfloat16)}


def _with_half_rules(fn, family, slow):
    """``fn`` (an op's implementation) under the half-precision rules of ``family``."""
    def run(ctx, inputs, attrs):
        floats = [t for t in inputs if t is not None and t.is_floating_point()]
        dtypes = {t.dtype for t in floats}
        low = {d for d in dtypes if d in (torch.float16, torch.bfloat16)}
        if not low:
            return fn(ctx, inputs, attrs)
        if len(dtypes) == 1:
            dtype = next(iter(low))
            if floats[0].device.type != "cpu" or family not in slow.get(dtype, ()):
                return fn(ctx, inputs, attrs)
        else:
            dtype = None  # mixed operands: computed, and returned, in float32
        widened = [t.float() if t is not None and t.dtype in low else t for t in inputs]
        outputs = fn(ctx, widened, attrs)
        if dtype is None:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs.to(dtype) if outputs.dtype == torch.float32 else outputs
        return [o.to(dtype) if isinstance(o, torch.Tensor) and o.dtype == torch.float32 else o for o in outputs]
    return run


class RunState:
    """Shared by the graph's modules during a host call: the current micro-batch and what the
    gradient taps recorded."""

    def __init__(self, opsets: dict[str, int]):
        self.opsets = opsets
        self.micro_batch = 0
        self.replication_factor = 1
        self.gradients: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
        self.seeds: dict[int, torch.Tensor] = {}
        self.recomputing = False  # a recomputation region re-running in backward (recompute.py)
        self.tapped = set()
        self.fetched_index: dict[str, int] = {}

    def reset(self) -> None:
        self.gradients = defaultdict(dict)
        self.seeds = {}

    def tap(self, tensor_id: str, value: torch.Tensor) -> torch.Tensor:
        if tensor_id not in self.tapped or not torch.is_grad_enabled() or not value.requires_grad:
            return value
        return GradientTap.apply(value, self, tensor_id, self.micro_batch)

    def seed_tap(self, loss: torch.Tensor) -> torch.Tensor:
        if not self.tapped or not loss.requires_grad:
            return loss
        return GradientTap.apply(loss, self, None, self.micro_batch)

    def record(self, tensor_id: Optional[str], index: int, grad: torch.Tensor) -> None:
        grad = grad.detach().to("cpu", copy=True)
        if tensor_id is None:
            self.seeds[index] = grad
        else:
            # A recomputed segment replays its taps: the last backward's value is the one.
            self.gradients[tensor_id][index] = grad


class GradientTap(torch.autograd.Function):
    """Identity in forward; in backward, hands the incoming gradient to the ``RunState``."""

    @staticmethod
    def forward(ctx, x, state, tensor_id, index):
        ctx.state, ctx.tensor_id, ctx.index = state, tensor_id, index
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.state.record(ctx.tensor_id, ctx.index, grad)
        return grad, None, None, None


class Segment(torch.nn.Module):
    """Consecutive nodes of one pipeline stage / virtual graph. Owns the initializers first used
    here; takes ``live_in`` tensors, returns ``live_out``."""

    def __init__(self, program: GraphProgram, node_indices: Sequence[int], live_in: list[str],
                 live_out: list[str], owned: list[str], trainable: set, state: RunState, constant_weights=False,
                 recomputation=RecomputationType.NoRecompute, half_rules=None):
        super().__init__()
        self.node_indices = list(node_indices)
        self.live_in = list(live_in)
        self.live_out = list(live_out)
        self._program = program
        self._state = state
        self._owned = []  # (tensor id, attribute name, tapped)
        tapped = state.tapped
        nodes = [program.nodes[i] for i in self.node_indices]
        # Resolved once, per mode (the op contexts are fixed: nothing is changed while running):
        # (input names, output names, implementation, context, attributes, outputs tapped) per node.
        self._steps_by_mode = {}
        kept = None
        for training in (False, True):
            steps = []
            for i, node in zip(self.node_indices, nodes):
                entry = registry.lookup(node.domain, node.op_type)
                ctx = registry.OpContext(opset=program.opset_of(node), training=training,
                                         node_name=node.name or node.output[0], op_type=node.op_type,
                                         graph=state, node=node if _has_body(node) else NodeView(node))
                step = (program.node_inputs[i], program.node_outputs[i], entry.fn, ctx, program.attrs[i])
                steps.append(_folded(step) if node.op_type == "Constant" and not node.input else step)
            steps, kept = fusion.fuse(steps, nodes, set(self.live_out) | tapped)
            if half_rules is not None:  # (a fused MatMul+Add is of the matmul family)
                families = [_HALF_FAMILIES.get((registry._canon(n.domain), n.op_type)) for n in nodes]
                fused = {k for k, step in enumerate(steps) if getattr(step[2], "__name__", "") == "matmul_add"}
                steps = [(step[0], step[1],
                          _with_half_rules(step[2], MATMUL if k in fused else families[j], half_rules),
                          step[3], step[4]) if (k in fused or families[j] is not None) else step
                         for k, (j, step) in enumerate(zip(kept, steps))]
            self._steps_by_mode[training] = [
                (tuple(inputs), tuple(outputs), fn, ctx, attrs,
                 tuple(bool(name) and name in tapped for name in outputs))
                for inputs, outputs, fn, ctx, attrs in steps]
        for k, name in enumerate(owned):
            value = torch.from_numpy(np.array(program.initializers[name], copy=True))
            if name in trainable and not constant_weights:
                attr = f"weight_{k}"
                self.register_parameter(attr, torch.nn.Parameter(value))
            else:
                attr = f"constant_{k}"
                self.register_buffer(attr, value)
            self._owned.append((name, attr, name in tapped))
        self._constants = {name for name in program.initializers if name not in trainable or constant_weights}
        self._groups = _recompute_groups([nodes[k] for k in kept], self._steps_by_mode[False], recomputation,
                                         self.live_out)
        self._recomputes = any(outputs is not None for _, _, _, outputs in self._groups)

    @property
    def _steps(self):
        return self._steps_by_mode[self.training]

    def owned(self):
        return [(name, getattr(self, attr)) for name, attr, _ in self._owned]

    def forward(self, *values):
        env = dict(zip(self.live_in, values))
        state = self._state
        for name, attr, tapped in self._owned:
            env[name] = state.tap(name, getattr(self, attr)) if tapped else getattr(self, attr)
        steps = self._steps_by_mode[self.training]
        if not self._recomputes:
            self._run(env, steps, 0, len(steps))
            return tuple(env[name] for name in self.live_out)
        # Traced into a compiled program, the regions run plain (the program keeps what it keeps;
        # the numbers are the same): checkpointing's bookkeeping changes RunState while running.
        recompute = self.training and torch.is_grad_enabled() and not torch.compiler.is_compiling()
        for start, stop, inputs, outputs in self._groups:
            if outputs is None or not recompute:
                self._run(env, steps, start, stop)
                continue

            # Constants (BatchNorm statistics, updated in place) are read, not stashed.
            held = {name: env[name] for name in inputs if name in self._constants}
            stashed = [name for name in inputs if name not in held]

            def region(*values, start=start, stop=stop, held=held, stashed=stashed, outputs=outputs):
                local = dict(held)
                local.update(zip(stashed, values))
                self._run(local, steps, start, stop)
                return tuple(local[name] for name in outputs)
            env.update(zip(outputs, recompute_module.run_checkpointed(state, region, [env[n] for n in stashed])))
        return tuple(env[name] for name in self.live_out)

    def _run(self, env, steps, start, stop):
        """``steps[start:stop]`` of the segment on the tensors in ``env``."""
        state = self._state
        for input_names, output_names, fn, ctx, attrs, tapped in steps[start:stop]:
            outputs = fn(ctx, [env[name] if name else None for name in input_names], attrs)
            if isinstance(outputs, torch.Tensor):
                outputs = (outputs,)
            for name, value, tap in zip(output_names, outputs, tapped):
                if name:
                    env[name] = state.tap(name, value) if tap else value


def _folded(step):
    """A ``Constant`` node's step computed once: its value is the same at every call (a failing
    one is left to fail when it runs, as before)."""
    inputs, outputs, fn, ctx, attrs = step
    try:
        value = fn(ctx, [], attrs)
    except Exception:
        return step
    if not isinstance(value, torch.Tensor):
        return step

    def constant(ctx, inputs, attrs):
        return value
    return inputs, outputs, constant, ctx, attrs


def _recompute_groups(nodes, steps, recomputation, live_out):
    """``(start, stop, inputs, outputs)`` per run of steps; ``outputs`` is None for steps that are
    not recomputed, else the region's tensors used after it (``recompute.py``). ``nodes[k]`` is
    the node whose annotations step ``k`` carries."""
    regions = recompute_module.regions(nodes, recomputation)
    groups = []
    start = 0
    for i in range(1, len(steps) + 1):
        if i < len(steps) and regions[i] == regions[start]:
            continue
        if regions[start] is None:
            groups.append((start, i, None, None))
        else:
            produced = [out for step in steps[start:i] for out in step[1] if out]
            inputs = []
            for step in steps[start:i]:
                for name in step[0]:
                    if name and name not in produced and name not in inputs:
                        inputs.append(name)
            later = set(live_out) | {name for step in steps[i:] for name in step[0]}
            groups.append((start, i, inputs, [name for name in produced if name in later]))
        start = i
    return groups


class OnnxGraphModule(torch.nn.Module):
    """The whole graph: segments in order, plus the loss and the anchored activations."""

    def __init__(self, program: GraphProgram, segments: list[list[int]], *, fetch: list[str],
                 loss: Optional[str], tapped: set, constant_weights: bool = False,
                 recomputation=RecomputationType.NoRecompute):
        super().__init__()
        self._program = program
        self.state = RunState(program.opsets)
        self.state.tapped = set(tapped)
        self.input_ids = list(program.input_ids)
        self.input_infos = [program.input_info(i) for i in self.input_ids]
        self._input_shapes = [torch.Size(info.shape()) for info in self.input_infos]
        self.fetch = list(fetch)
        # Weights are updated in place later in the call: anchored, their current value is copied.
        self._fetch_copied = tuple(name in program.initializers for name in self.fetch)
        self.loss = loss
        trainable = set(program.trainable_initializers())
        self.trainable_ids = [t for t in program.initializers if t in trainable]
        half_rules = _half_rules(program)
        # Read by the runtime (precision.py): the graph applies the half-precision rules itself.
        self.computes_low_precision = half_rules is not None
        produced = [{out for i in seg for out in program.nodes[i].output if out} for seg in segments]
        used = [{name for i in seg for name in program.node_inputs[i] if name} for seg in segments]
        owner = {}
        for k, names in enumerate(used):
            for name in sorted(names):
                if name in program.initializers and name not in owner:
                    owner[name] = k
        for name in program.initializers:  # unused initializers still belong to the model
            owner.setdefault(name, 0)
        needed_at_end = set(fetch) | ({loss} if loss else set())
        available = set(self.input_ids)
        modules = []
        for k, seg in enumerate(segments):
            owned = [name for name in program.initializers if owner[name] == k]
            later = set().union(*used[k + 1:]) | needed_at_end
            live_in = sorted(n for n in used[k] if n not in produced[k] and n not in owned and n in available)
            missing = [n for n in used[k] if n not in produced[k] and n not in owned and n not in available]
            if missing:
                raise popart_exception(messages.TENSOR_USED_BEFORE_ITS_STAGE.format(missing=missing[0]))
            here = produced[k] | set(owned)
            live_out = sorted(n for n in here if n in later)
            modules.append(Segment(program, seg, live_in, live_out, owned, trainable, self.state, constant_weights,
                                   recomputation, half_rules))
            available |= here
        self.segments = torch.nn.ModuleList(modules)
        missing = [t for t in needed_at_end if t not in available]
        if missing:
            raise popart_exception(messages.TENSOR_NOT_PRODUCED.format(missing=missing[0]))

    def weights(self) -> dict[str, torch.Tensor]:
        """Every initializer by its ONNX name (Parameters and constants)."""
        found = {}
        for segment in self.segments:
            found.update(dict(segment.owned()))
        return found

    def forward(self, micro_batch_index, *inputs):
        state = self.state
        tapped = state.tapped
        if tapped:  # gradient anchors record per micro-batch (eager only: sessions.py)
            state.micro_batch = int(micro_batch_index.reshape(-1)[0])
        env = {}
        for tensor_id, value, shape in zip(self.input_ids, inputs, self._input_shapes):
            if value.shape != shape:
                value = value.reshape(shape)
            if tapped and tensor_id in tapped and torch.is_grad_enabled():
                value = state.tap(tensor_id, value.detach().requires_grad_(True))
            env[tensor_id] = value
        for segment in self.segments:
            outputs = segment(*[env[name] for name in segment.live_in])
            env.update(zip(segment.live_out, outputs))
        fetched = tuple(env[name].detach().clone().unsqueeze(0) if copied else env[name].unsqueeze(0)
                        for name, copied in zip(self.fetch, self._fetch_copied))
        if self.loss is None:
            return fetched
        loss = env[self.loss]
        loss = state.seed_tap(loss if loss.dim() == 0 else loss.sum()) if tapped else \
            (loss if loss.dim() == 0 else loss.sum())
        if torch.is_grad_enabled() and not loss.requires_grad and loss.is_floating_point():
            # Nothing trainable under the loss (all weights constants): PopART trains it as a no-op.
            loss = loss.detach().requires_grad_(True)
        return (identity_loss(loss, reduction="none"),) + fetched


def run_subgraph(ctx, graph_proto: onnx.GraphProto, inputs):
    """``aiGraphcore.call``: run the callee graph on ``inputs``."""
    state = ctx.graph
    opsets = state.opsets if state is not None else {registry.ONNX_DOMAIN: 10, registry.GRAPHCORE_DOMAIN: 1}
    initializers = {i.name for i in graph_proto.initializer}
    env = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph_proto.initializer}
    names = [v.name for v in graph_proto.input if v.name not in initializers]
    if len(names) != len(inputs):
        raise popart_exception(messages.CALL_INPUT_COUNT.format(
            node_name=ctx.node_name, n_names=len(names), n_inputs=len(inputs)))
    env.update(zip(names, inputs))
    for node in graph_proto.node:
        entry = registry.lookup(node.domain, node.op_type)
        opset = opsets.get(registry._canon(node.domain), 1)
        if entry is None:
            raise popart_exception(unsupported_message(node, opset))
        outputs = run_node(node, [env[n] if n else None for n in inputs_of(node)], opset, training=ctx.training,
                           graph=state)
        env.update((n, v) for n, v in zip(node.output, outputs) if n)
    return [env[v.name] for v in graph_proto.output]
