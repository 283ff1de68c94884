"""Eager host calls keep their speed after another model in the process has compiled and run
(issue 32): they run the same calls as before and find the process as they left it - counted and
compared, not timed (``benchmarks/eager_after_compile.py`` times it).

Two things a compile leaves are torch's. Every call of a ``torch.compile``d function allocates the
thread's functorch state, which the autograd engine then copies about three times per node of every
backward: openpop drops it again after its compiled calls (``runtime/compiled/functorch_state.py``).
And the first ``torch.compile`` in a process runs Dynamo's ``TorchPatcher.patch()``
(``torch/_dynamo/eval_frame.py``), which wraps every ``torch.optim`` class's ``_init_group`` in
``torch._dynamo.disable``, so each ``optimizer.step()`` runs Dynamo's disable wrapper once per
parameter group from then on, in any eager loop (~0.6 us a step): that one stays."""
import os
import sys
import threading

import pytest
import torch

import poptorch
from openpop.runtime.compiled import functorch_state

from helpers.call_counts import calls_made
from helpers.models import Classifier, classifier_batch, loss_of
from helpers.process_resources import descendants


def _identity(tensor):
    return tensor


def _apply_torchs_patch():
    """Building a ``torch.compile`` wrapper runs ``TorchPatcher.patch`` (once per process), compiling nothing."""
    torch.compile(_identity)


def _training(backend):
    model = Classifier()
    options = poptorch.Options().deviceIterations(2).openpopBackend(backend).showCompilationProgressBar(False)
    return poptorch.trainingModel(model, options, torch.optim.SGD(model.parameters(), lr=0.01))


def _process_state():
    """What would make every op slower without changing the calls it makes."""
    modules = torch.nn.modules.module
    optimizers = sys.modules["torch.optim.optimizer"]
    return {
        "threads": (torch.get_num_threads(), torch.get_num_interop_threads()),
        "grad mode": (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.is_anomaly_enabled()),
        "Dynamo's eval-frame callback": torch._C._dynamo.eval_frame.get_eval_frame_callback(),
        "dispatch keys (TLS)": (str(torch._C._dispatch_tls_local_include_set()),
                                str(torch._C._dispatch_tls_local_exclude_set())),
        "torch function/dispatch modes": (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()),
        "profiler": torch.autograd.profiler._is_profiler_enabled,
        "float32 denormals kept": torch.tensor([1e-40]).mul(1.0).item() != 0.0,
        "global module hooks": (len(modules._global_forward_hooks), len(modules._global_forward_pre_hooks),
                                len(modules._global_backward_hooks)),
        "global optimizer hooks": (len(optimizers._global_optimizer_pre_hooks),
                                   len(optimizers._global_optimizer_post_hooks)),
        "Python profile/trace": (sys.getprofile(), sys.gettrace()),
        "functorch state (copied at each autograd node)": functorch_state.present(),
    }


@pytest.mark.slow
def test_a_finished_compile_leaves_eager_host_calls_and_loops_as_they_were(one_thread):
    _apply_torchs_patch()  # torch's, once per process: applied first so that only the compile's own leftovers differ
    functorch_state.drop_if_empty()  # one left by an earlier test's own torch.compile in this process
    eager = _training("eager")
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, labels = classifier_batch(rows=8)

    def loop():
        for rows in (slice(0, 4), slice(4, 8)):
            optimizer.zero_grad()
            loss_of(model, x[rows], labels[rows]).backward()
            optimizer.step()

    calls = {"openpop eager host call": lambda: eager(x, labels), "torch loop": loop}

    def counted():
        for call in calls.values():
            call()  # a cache the compile crowded out (typing's) fills again here, once
        return {name: calls_made(call, c_functions=True) for name, call in calls.items()}

    before, state = counted(), _process_state()
    threads, children = set(threading.enumerate()), set(descendants(os.getpid()))
    compiled = _training("compiled")
    compiled(x, labels)
    compiled(x, labels)
    assert compiled._dispatch.compiled.last == "compiled"
    after = counted()
    for name in calls:
        assert after[name] == before[name], (name, after[name] - before[name], before[name] - after[name])
    assert state["functorch state (copied at each autograd node)"] is not True
    assert _process_state() == state
    # torch.fx's Interpreter makes a (disabled) tqdm bar, for which tqdm starts its monitor thread (it
    # wakes every 10 s); torch's, on a cold compile only
    assert [t.name for t in set(threading.enumerate()) - threads if t.name != "tqdm_monitor"] == []
    assert set(descendants(os.getpid())) - children == set()  # no compile workers left running


def test_torchs_optimizer_patch_adds_only_dynamos_disable_wrapper_to_a_step(monkeypatch):
    """The cost an eager step keeps after any ``torch.compile`` in the process, and its mechanism:
    Dynamo's disable wrapper around ``_init_group`` (its frames, which ``calls_made`` leaves out,
    and the C calls that set and restore the eval-frame callback)."""
    _apply_torchs_patch()
    wrapped = torch.optim.SGD.__dict__["_init_group"]
    assert getattr(wrapped, "_torchdynamo_disable", False), "torch no longer wraps the optimizers' _init_group"
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_of(model, *classifier_batch()).backward()
    optimizer.step()
    patched = calls_made(optimizer.step, c_functions=True)
    monkeypatch.setattr(torch.optim.SGD, "_init_group", wrapped._torchdynamo_orig_callable)
    unpatched = calls_made(optimizer.step, c_functions=True)
    added = patched - unpatched
    assert unpatched - patched == {}
    assert added and set(added) <= {("C", "set_eval_frame"), ("C", "getattr")}, added


@pytest.mark.skipif(not functorch_state.available(), reason="libtorch's functorch state cannot be read here")
def test_an_empty_functorch_state_is_dropped_a_used_one_kept():
    torch._C._functorch.peek_interpreter_stack()  # what a compiled call asks: the thread's state is made
    assert functorch_state.present()
    assert functorch_state.drop_if_empty()
    assert not functorch_state.present()
    assert not functorch_state.drop_if_empty()

    def inside_a_transform(x):
        assert not functorch_state.drop_if_empty()  # a transform on the stack: kept
        return (x * x).sum()

    assert torch.equal(torch.func.grad(inside_a_transform)(torch.ones(3)), torch.full((3,), 2.0))
    torch._C._functorch.set_inplace_requires_grad_allowed(True)
    try:
        assert not functorch_state.drop_if_empty()  # a flag set: kept
    finally:
        torch._C._functorch.set_inplace_requires_grad_allowed(False)
    assert functorch_state.drop_if_empty()
    weight = torch.ones(2, requires_grad=True)
    (weight * 3).sum().backward()  # autograd as before
    assert torch.equal(weight.grad, torch.full((2,), 3.0))


@pytest.mark.skipif(not functorch_state.available(), reason="libtorch's functorch state cannot be read here")
def test_the_state_is_read_per_thread_and_a_new_one_dropped_unread():
    """Each thread reads its own state; ``absent_before`` (the repeat path's: no state before the
    host call) drops without reading the flags, which a set flag shows."""
    functorch_state.drop_if_empty()
    seen = {}

    def other():
        torch._C._functorch.peek_interpreter_stack()
        seen["other"] = functorch_state.present()
        seen["dropped"] = functorch_state.drop_if_empty()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == {"other": True, "dropped": True} and functorch_state.present() is False
    torch._C._functorch.set_inplace_requires_grad_allowed(True)
    try:
        assert not functorch_state.drop_if_empty()
        assert functorch_state.drop_if_empty(absent_before=True)  # trusted: the flag is not read
    finally:
        torch._C._functorch.set_inplace_requires_grad_allowed(False)
        functorch_state.drop_if_empty()
    assert functorch_state.present() is False


def test_a_torch_it_was_not_checked_on_is_left_alone(monkeypatch):
    """The accessor's return type is not in its mangled name: another torch minor version may
    have changed it, so nothing is looked up or dropped there."""
    from openpop.runtime.compiled import functorch_state
    monkeypatch.setattr(functorch_state, "_functions", None)
    monkeypatch.setattr(functorch_state.torch, "__version__", "9.9.0")
    assert not functorch_state.available() and functorch_state.present() is None
    assert functorch_state.drop_if_empty() is False
