"""The compiled program runs the micro-batches of a step (gradientAccumulation x replicationFactor)
as a while_loop (runtime/compiled/micro_batches.py): the graph Dynamo traces holds one forward and
backward whatever their number. The graphs are recorded by a backend that runs them as traced (no
Inductor: cheap), which also checks the looped program's numbers against the oracle."""
import copy
import dataclasses
import pathlib

import pytest
import torch

import poptorch

from helpers.models import Regressor, make_data, regressor_loss
from helpers.oracle import train_loop


@pytest.fixture
def traced_graphs(monkeypatch):
    """The graphs the compiled backend's ``torch.compile`` calls hand to their backend."""
    graphs = []
    compile_ = torch.compile

    def recording_compile(fn, **kwargs):
        def record(graph_module, example_inputs):
            graphs.append(graph_module)
            return graph_module.forward

        return compile_(fn, fullgraph=True, dynamic=False, backend=record)

    monkeypatch.setattr(torch, "compile", recording_compile)
    return graphs


def linear_calls(graph_module) -> int:
    """``Linear`` forwards in a graph and its subgraphs (loop and ``torch.func.grad`` bodies)."""
    return sum(1 for module in graph_module.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes if node.op == "call_function" and "linear" in str(node.target))


def options(di, ga, r):
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r).openpopBackend("compiled")
    opts.Training.gradientAccumulation(ga)
    opts.outputMode(poptorch.OutputMode.All)
    opts.showCompilationProgressBar(False)
    return opts


@pytest.mark.parametrize("di,ga,r", [(1, 1, 1), (1, 4, 1), (2, 2, 2)])
def test_training_traces_one_forward_whatever_the_micro_batch_count(traced_graphs, di, ga, r):
    model = Regressor()  # two Linear layers
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(di, ga, r), poptorch.optim.SGD(model.parameters(), lr=0.1,
                                                                               momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for call in range(2):
        x, t = make_data(di * ga * r * 3, seed=call)
        _, losses = pop(x, t)
        assert pop._dispatch.compiled.last == "compiled"
        ref_losses = train_loop(reference, ref_opt, (x, t), regressor_loss, di, ga, r, "mean")
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)
    assert [linear_calls(graph) for graph in traced_graphs] == [2]
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.fixture
def inlined_by_dynamo(monkeypatch):
    """(function, its caller's file) of every function Dynamo inlines while tracing."""
    from torch._dynamo import symbolic_convert

    inlined = []
    build = symbolic_convert.InliningInstructionTranslator.build_inline_tracer

    def recording(parent, func, *args, **kwargs):
        code = func.get_code()
        inlined.append((f"{code.co_filename}:{code.co_name}", parent.f_code.co_filename))
        return build(parent, func, *args, **kwargs)

    monkeypatch.setattr(symbolic_convert.InliningInstructionTranslator, "build_inline_tracer",
                        staticmethod(recording))
    return inlined


def test_loops_reach_dynamo_flat(traced_graphs, inlined_by_dynamo):
    """The device-iteration and micro-batch loops hand Dynamo flat tuples: it traces neither
    torch's ``while_loop`` wrapper (a pytree flatten and two unflattens of every carried value)
    nor a pytree flattening of the optimizer state by openpop, each bytecode by bytecode on every
    new program (``compiled/flat_loop.py``)."""
    model = Regressor()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(2, 2, 1), poptorch.optim.Adam(model.parameters(), lr=0.01))
    x, t = make_data(2 * 2 * 3, seed=0)
    _, losses = pop(x, t)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    torch.testing.assert_close(losses.reshape(-1), train_loop(reference, ref_opt, (x, t), regressor_loss, 2, 2, 1,
                                                              "mean"), rtol=1e-5, atol=1e-6)
    assert any(name.endswith("flat_loop.py:flat_while_loop") for name, _ in inlined_by_dynamo)
    assert not [name for name, _ in inlined_by_dynamo if name.endswith("_higher_order_ops/while_loop.py:while_loop")]
    # Dynamo's own handling of the loop operator flattens its operands through pytree, inlined in
    # the frame that calls the operator (flat_loop.py): unavoidable, and left out here
    openpop_src = pathlib.Path(poptorch.__file__).resolve().parent.parent / "openpop"
    assert not [(name, caller) for name, caller in inlined_by_dynamo if "utils/_pytree.py" in name
                and caller.startswith(str(openpop_src)) and not caller.endswith("flat_loop.py")]


def test_inference_replicas_trace_one_forward(traced_graphs):
    model = Regressor()
    opts = poptorch.Options().deviceIterations(2).replicationFactor(2).openpopBackend("compiled")
    opts.showCompilationProgressBar(False)
    pop = poptorch.inferenceModel(model, opts)
    x, t = make_data(2 * 2 * 3)
    out, _ = pop(x, t)
    assert pop._dispatch.compiled.last == "compiled"
    torch.testing.assert_close(out, model(x, t)[0], rtol=1e-5, atol=1e-6)
    assert [linear_calls(graph) for graph in traced_graphs] == [2]


class Reconstruct(torch.nn.Module):
    """``forward(x, target, mask=None, scale=1.0, reduction="mean")``: non-tensor defaults, and
    ``target`` may be ``x`` itself (an autoencoder's call: ``model(x, x)``)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x, target, mask=None, scale=1.0, reduction="mean"):
        out = self.fc(x)
        if mask is not None:
            out = out * mask
        return out, torch.nn.functional.mse_loss(out * scale, target, reduction=reduction)


def reconstruct_pair(model, options_):
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options_, poptorch.optim.SGD(model.parameters(), lr=0.1))
    return pop, reference, torch.optim.SGD(reference.parameters(), lr=0.1)


@pytest.mark.parametrize("given", ["omitted", "keywords"])
def test_program_takes_none_and_python_constants_as_arguments(traced_graphs, given):
    pop, reference, ref_opt = reconstruct_pair(Reconstruct(), options(2, 2, 1))
    kwargs = {} if given == "omitted" else {"mask": None, "scale": 0.5, "reduction": "sum"}
    for call in range(2):
        x, _ = make_data(12, seed=call)
        _, losses = pop(x, x.flip(0), **kwargs)
        assert pop._dispatch.compiled.last == "compiled"
        ref_losses = train_loop(reference, ref_opt, (x, x.flip(0)),
                                lambda m, a, b: m(a, b, **kwargs)[1], 2, 2, 1)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)
    assert len(traced_graphs) == 1
    for p, q in zip(pop.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    with pytest.raises(poptorch.Error, match="Value mismatch for scale: expected"):
        pop(x, x, scale=2.0)  # as PopTorch: a constant of the compiled call does not change


@pytest.mark.parametrize("aliasing", ["same-tensor", "rows-of-one-tensor"])
def test_program_takes_inputs_that_share_memory(traced_graphs, aliasing):
    """``model(x, x)``: ``while_loop`` refuses operands aliasing each other, so the program gets a
    copy; calls that alias and calls that do not alternate, each equal to the oracle."""
    pop, reference, ref_opt = reconstruct_pair(Reconstruct(), options(2, 2, 1))
    for call in range(4):
        if call % 2 == 0:  # shares memory
            x, _ = make_data(24 if aliasing == "rows-of-one-tensor" else 12, seed=call)
            a, b = (x[:12], x[12:]) if aliasing == "rows-of-one-tensor" else (x, x)
        else:
            a, _ = make_data(12, seed=call)
            b = a.flip(0)
        _, losses = pop(a, b)
        assert pop._dispatch.compiled.last == "compiled"
        ref_losses = train_loop(reference, ref_opt, (a.clone(), b.clone()), regressor_loss, 2, 2, 1)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(pop.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["eager", "compiled"])
def test_float_constants_compare_in_sign_and_nan(traced_graphs, backend):
    """A program bakes the first call's constants in: ``-0.0`` after ``0.0`` is PopTorch's value
    mismatch (equal by ``==``, not for ``copysign``), and NaN after NaN is the same value."""
    model = Reconstruct()
    opts = options(1, 1, 1).openpopBackend(backend)
    pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.0))
    x, _ = make_data(4)
    pop(x, x, scale=0.0)
    with pytest.raises(poptorch.Error, match="Value mismatch for scale: expected 0.0 but got -0.0"):
        pop(x, x, scale=-0.0)
    other = Reconstruct()
    nan = poptorch.trainingModel(other, options(1, 1, 1).openpopBackend(backend),
                                 poptorch.optim.SGD(other.parameters(), lr=0.0))
    for _ in range(2):
        nan(x, x, scale=float("nan"))


class DictInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, batch):
        out = self.fc(batch["x"]) * batch["scale"]
        return out, torch.nn.functional.mse_loss(out, batch["target"])


def test_program_follows_dict_inputs_given_in_another_key_order(traced_graphs):
    """The program places inputs by the first call's flattening: a dict in another key order
    builds another program instead of swapping its tensors (it did, silently)."""
    model = DictInputs()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(2, 2, 1), poptorch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for call in range(3):
        x, _ = make_data(12, seed=call)
        target = x.flip(0)
        batch = {"x": x, "target": target, "scale": 0.5} if call != 1 else {"target": target, "scale": 0.5, "x": x}
        _, losses = pop(batch)
        assert pop._dispatch.compiled.last == "compiled"
        ref_losses = train_loop(reference, ref_opt, (x, target),
                                lambda m, a, b: m({"x": a, "target": b, "scale": 0.5})[1], 2, 2, 1)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)


def test_set_optimizer_over_the_same_parameters_in_another_order(traced_graphs):
    """The program pairs weights with their optimizer state by position: an optimizer of the same
    kind over the parameters in another order builds another program (it mixed their momentum)."""
    model = Regressor()
    reference = copy.deepcopy(model)
    params = list(model.parameters())
    pop = poptorch.trainingModel(model, options(2, 1, 1), poptorch.optim.SGD(params, lr=0.1, momentum=0.9))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for call in range(3):
        if call == 1:
            pop.setOptimizer(poptorch.optim.SGD(params[::-1], lr=0.1, momentum=0.9))
        x, t = make_data(2 * 3, seed=call)
        _, losses = pop(x, t)
        assert pop._dispatch.compiled.last == "compiled"
        ref_losses = train_loop(reference, ref_opt, (x, t), regressor_loss, 2, 1, 1)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@dataclasses.dataclass
class ScaledBatch:
    x: torch.Tensor
    target: torch.Tensor
    scale: float


class PlainBatch:
    def __init__(self, x, target, scale):
        self.x, self.target, self.scale = x, target, scale


class BatchParser(poptorch.ICustomArgParser):
    def yieldTensors(self, struct):
        yield struct.x
        yield struct.target

    def reconstruct(self, original_structure, tensor_iterator):
        return type(original_structure)(next(tensor_iterator), next(tensor_iterator), original_structure.scale)


class ParsedInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, batch):
        out = self.fc(batch.x) * batch.scale
        return out, torch.nn.functional.mse_loss(out, batch.target)


@pytest.mark.parametrize("kind", [ScaledBatch, PlainBatch], ids=["dataclass", "plain-class"])
def test_program_follows_the_constants_of_custom_parser_inputs(traced_graphs, kind):
    """An input of a registered type (``poptorch.registerCustomArgParser``) is a new object each
    call: one program serves the calls whose other values (``scale``) are equal, another is built
    when they change. Before, every new object built a program (60 ms a call for a 0.2 ms model),
    and a dataclass holding tensors could not be compared at all."""
    poptorch.registerCustomArgParser(kind, BatchParser())
    model = ParsedInputs()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(2, 1, 1), poptorch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    scales = [1.0, 1.0, 3.0, 3.0, 1.0]
    for call, scale in enumerate(scales):
        x, _ = make_data(6, seed=call)
        _, losses = pop(kind(x, x.flip(0), scale))
        assert pop._dispatch.compiled.last == "compiled"
        ref_losses = train_loop(reference, ref_opt, (x, x.flip(0)),
                                lambda m, a, b, s=scale: m(kind(a, b, s))[1], 2, 1, 1)
        torch.testing.assert_close(losses.reshape(-1), ref_losses, rtol=1e-5, atol=1e-6)
    assert len(traced_graphs) == 3  # scale 1.0, 3.0, then 1.0 again (the program kept is the last one)


class BiasedBatch(PlainBatch):
    """A batch holding a tensor its parser does not yield (kept from the object, as ``scale``)."""

    def __init__(self, x, target, scale, bias=None):
        super().__init__(x, target, scale)
        self.bias = bias


class BiasedParser(BatchParser):
    def reconstruct(self, original_structure, tensor_iterator):
        return BiasedBatch(next(tensor_iterator), next(tensor_iterator), original_structure.scale,
                           original_structure.bias)


class UsesBias(ParsedInputs):
    def forward(self, batch):
        out = self.fc(batch.x) * batch.scale + batch.bias
        return out, torch.nn.functional.mse_loss(out, batch.target)


def test_program_does_not_keep_a_tensor_the_parser_does_not_yield(traced_graphs):
    """A tensor attribute the parser leaves out is the same only as itself: a new one builds
    another program rather than the first call's being kept."""
    poptorch.registerCustomArgParser(BiasedBatch, BiasedParser())
    model = UsesBias()
    pop = poptorch.inferenceModel(model, options(2, 1, 1))
    x, _ = make_data(6)
    for bias in (torch.zeros(6), torch.ones(6)):
        out, _ = pop(BiasedBatch(x, x, 1.0, bias))
        assert pop._dispatch.compiled.last == "compiled"
        torch.testing.assert_close(out, model.fc(x) + bias)
