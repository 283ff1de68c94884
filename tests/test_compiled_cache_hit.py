"""Compiled calls that hit Dynamo's cache run its code after Dynamo's own guard check, without
its per-call frame machinery, and the guards programs keep (runtime/compiled/cache_hit.py)."""
import copy
import types

import torch

import poptorch
from openpop.runtime.compiled import cache_hit
from openpop.runtime.compiled.cache_hit import program_guards

from helpers.models import make_data
from helpers.oracle import train_loop

OFFSET = 0.0  # a global the forward reads: guarded


def options():
    opts = poptorch.Options().openpopBackend("compiled")
    opts.showCompilationProgressBar(False)
    return opts


class Scaled(torch.nn.Module):
    """A linear layer whose output is scaled by an attribute and shifted by a global the forward
    reads: Dynamo guards both, so a new value re-traces."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 2)
        self.scale = 2.0

    def forward(self, x, target):
        out = self.fc(x) * self.scale + OFFSET
        return out, torch.nn.functional.mse_loss(out, target)


def test_cache_hits_skip_dynamos_frame_evaluation_and_guards_still_retrace(monkeypatch):
    """Calls whose guards pass run the compiled code without Dynamo's per-call machinery
    (compiled/cache_hit.py); a Python value the forward reads that changed fails a guard and goes
    through Dynamo (a recompile), and a changed torch.compile stance is honoured."""
    torch.manual_seed(0)
    model = Scaled()
    reference = copy.deepcopy(model)
    pop = poptorch.trainingModel(model, options(), torch.optim.SGD(model.parameters(), lr=0.1))
    oracle = torch.optim.SGD(reference.parameters(), lr=0.1)
    through_dynamo = []

    def call(seed):
        x, t = make_data(4, seed=seed)
        _, loss = pop(x, t)
        expected = train_loop(reference, oracle, (x, t), lambda m, *xs: m(*xs)[1], 1, 1, 1)
        torch.testing.assert_close(loss, expected[0], rtol=1e-5, atol=1e-6)

    call(0)
    program_call = pop._dispatch.compiled._program._compiled
    dynamo = program_call._compiled
    program_call._compiled = lambda *args: through_dynamo.append(1) or dynamo(*args)
    call(1)
    call(2)
    assert through_dynamo == []
    model.scale = reference.scale = 3.0  # a guard fails: Dynamo traces again - twice: the program
    call(3)                              # refuses the trace until a probe finds it holds it (backend.py)
    assert through_dynamo == [1, 1]
    call(4)  # the new entry's guards pass
    assert through_dynamo == [1, 1]
    global OFFSET
    OFFSET = 0.5
    try:
        call(5)
        assert through_dynamo == [1] * 4
    finally:
        OFFSET = 0.0
    with torch.compiler.set_stance("force_eager"):
        call(6)
    assert through_dynamo == [1] * 5  # (torch.compile's stance: no trace, nothing refused)
    # The entry's code calls its compiled graph without Dynamo's disable wrapper ...
    code, function = program_call._functions[0]
    graphs = [function.__globals__[name] for name in code.co_names if name.startswith("__compiled_fn")]
    assert graphs and not any(getattr(graph, "_torchdynamo_disable", False) for graph in graphs)
    # ... which only matters under Dynamo's frame callback: then the call goes through Dynamo.
    monkeypatch.setattr(cache_hit, "_eval_frame_callback", lambda: object())
    call(7)
    assert through_dynamo == [1] * 6
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_programs_keep_guards_on_tensors_the_model_and_user_globals_only():
    kept = {
        "trained[0]": True, "split_inputs[1]": True, "": True,  # tensors; grad mode and other global state
        "self.model._modules['fc']._parameters['weight']": True, "self.model.scale": True,
        "dict(type(self.model).__mro__[1].__dict__)": True, "self.forward_contexts": True,
        "G['__import_helpers_dot_models'].torch": True, "G['__import_torch_utils'].x": True,
        "G['_140714672332752_c0'].Tensor": True,  # a global Dynamo installed: kept
        "self": False, "self.layout.geometry.device_iterations": False, "self.optim.static[2]": False,
        "dict(type(self.layout.geometry).__dict__)['micro_batches_per_step'].fget": False,
        "G['torch'].relu": False, "G['_within']": False, "G['__builtins_dict___0']['len']": False,
        "G['__import_torch_dot__functorch_dot_eager_transforms']": False,
        "G['__import_openpop_dot_runtime_dot_outputs'].torch": False,
        "list(dict.keys(__import__('torch').utils._pytree.SUPPORTED_NODES))[1]": False,
    }
    entries = [types.SimpleNamespace(name=name) for name in kept]
    assert dict(zip(kept, program_guards(entries))) == kept
