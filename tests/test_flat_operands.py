"""The Dynamo pass ``flat_operands`` (``runtime/compiled/flat_operands.py``): while a program is
traced, Dynamo flattens flat loop operands without inlining pytree, and builds the same graph."""
import contextlib

import torch
from torch._higher_order_ops.scan import scan

import poptorch
from openpop import torch_compat
from openpop.runtime.compiled import flat_operands, passes
from openpop.torch_compat import while_loop

from helpers.models import Regressor, make_data


def _loops(x, y, state):
    """A cond and a while_loop over flat operands, a while_loop over nested ones, a scan."""
    a, b = torch.cond(x.sum() > 0, lambda p, q: (p.sin(), q.cos()), lambda p, q: (p.cos(), q.sin()), (x, y))
    _, a, b = while_loop(lambda i, p, q: i < 3, lambda i, p, q: (i + 1, p * 2, q + p), (torch.tensor(0), a, b))
    nested = while_loop(lambda i, s: i < 2, lambda i, s: (i + 1, {"m": s["m"] * 0.5, "v": s["v"] + 1}),
                        (torch.tensor(0), state))
    total, partial = scan(lambda c, row: (c + row, (c + row) * 2), a, torch.stack([a, b]))
    return a, b, nested[1]["m"], nested[1]["v"], total, partial


def _traced(within):
    """(the graph and its subgraphs as their nodes' (op, target, arguments) - names aside: pytree's
    traced code names values -, results) of ``_loops`` compiled inside ``within``."""
    codes = []

    def record(graph_module, example_inputs):
        for module in graph_module.modules():
            if isinstance(module, torch.fx.GraphModule):
                index = {node: k for k, node in enumerate(module.graph.nodes)}
                codes.append([(node.op, "" if node.op == "placeholder" else str(node.target),
                               str(torch.fx.node.map_arg((node.args, node.kwargs), lambda n, index=index: index[n])))
                              for node in module.graph.nodes])
        return graph_module.forward

    torch._dynamo.reset()
    args = (torch.randn(3), torch.randn(3), {"m": torch.ones(2), "v": torch.zeros(2)})
    torch.manual_seed(0)
    with within():
        out = torch.compile(_loops, fullgraph=True, backend=record)(*args)
    return codes, out, _loops(*args)


def _counted(monkeypatch):
    direct = {"flatten": 0, "unflatten": 0}
    for name in direct:
        original = getattr(flat_operands, f"_{name}")

        def counting(*args, _original=original, _name=name):
            result = _original(*args)
            direct[_name] += result is not None
            return result

        monkeypatch.setattr(flat_operands, f"_{name}", counting)
    return direct


def test_direct_path_builds_the_same_graph_as_dynamo_s_pytree(monkeypatch):
    direct = _counted(monkeypatch)
    plain_codes, plain, expected = _traced(contextlib.nullcontext)
    assert direct == {"flatten": 0, "unflatten": 0}
    codes, out, _ = _traced(flat_operands.flat_operands)
    assert direct["flatten"] >= 3 and direct["unflatten"] >= 1  # the cond's and the flat loop's operands
    assert codes == plain_codes
    for got, want, plain_out in zip(out, expected, plain):
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got, plain_out)
    assert torch_compat.dynamo_higher_order_ops._make_inlined is not flat_operands._make_inlined  # restored
    assert not flat_operands._specs


def test_switched_off_dynamo_inlines_pytree(monkeypatch):
    monkeypatch.setenv(passes.DISABLE_ENV, "flat_operands")
    hops = torch_compat.dynamo_higher_order_ops
    before = hops._make_inlined
    with flat_operands.flat_operands():
        assert hops._make_inlined is before


def test_nested_entries_keep_the_pass_until_the_outermost_leaves():
    hops = torch_compat.dynamo_higher_order_ops
    before = hops._make_inlined
    with flat_operands.flat_operands():
        with flat_operands.flat_operands():
            assert hops._make_inlined is flat_operands._make_inlined
        assert hops._make_inlined is flat_operands._make_inlined
    assert hops._make_inlined is before


def test_programs_train_alike_with_and_without_the_pass(monkeypatch):
    direct = _counted(monkeypatch)
    runs = {}
    for disabled in ("flat_operands", ""):
        monkeypatch.setenv(passes.DISABLE_ENV, disabled)
        torch.manual_seed(0)
        model = Regressor()
        opts = poptorch.Options().deviceIterations(2).openpopBackend("compiled")
        opts.Training.gradientAccumulation(2)
        opts.showCompilationProgressBar(False)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.Adam(model.parameters(), lr=0.01))
        _, losses = pop(*make_data(2 * 2 * 3, seed=0))
        assert pop._dispatch.compiled.last == "compiled"
        runs[disabled] = (losses, [p.detach().clone() for p in model.parameters()])
        assert (direct["flatten"] > 0) == (not disabled)  # the loops' operands took the direct path
    (losses, weights), (plain_losses, plain_weights) = runs[""], runs["flat_operands"]
    torch.testing.assert_close(losses, plain_losses, rtol=0, atol=0)
    for got, want in zip(weights, plain_weights):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
