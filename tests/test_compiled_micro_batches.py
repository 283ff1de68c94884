"""The compiled program runs the micro-batches of a step (gradientAccumulation x replicationFactor)
as a while_loop (runtime/compiled/micro_batches.py): the graph Dynamo traces holds one forward and
backward whatever their number. The graphs are recorded by a backend that runs them as traced (no
Inductor: cheap), which also checks the looped program's numbers against the oracle."""
import copy

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
