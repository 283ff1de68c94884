"""The compiled backend with reduced precision: autocast, half weights, automatic loss scaling -
and anchored tensors in each output mode - against the eager backend, host call by host call
(docs/guides/compiled-backend.md)."""
import pytest
import torch

import poptorch

from helpers.models import Regressor, make_data

pytestmark = pytest.mark.usefixtures("one_thread")

OVERFLOW_STEP = 2  # of call 0: its float16 gradients overflow (automatic loss scaling skips it)
ANCHORS = {  # short name: (long name, output mode, period)
    "grad_w1": ("Gradient___fc1.weight", poptorch.OutputMode.All, 1),
    "grad_b2": ("Gradient___fc2.bias", poptorch.OutputMode.EveryN, 2),
    "new_b2": ("UpdatedVar___fc2.bias", poptorch.OutputMode.Sum, 1),
    "b1": ("model.fc1.bias", poptorch.OutputMode.Final, 1),
    "w2": ("fc2.weight", None, 1),  # the model's output mode
}


def options(backend, di):
    opts = poptorch.Options().deviceIterations(di).openpopBackend(backend)
    opts.Training.gradientAccumulation(2)
    opts.showCompilationProgressBar(False)
    for short, (long, mode, period) in ANCHORS.items():
        opts.anchorTensor(short, long, mode, period)
    return opts


def run_both(make_model, make_options, make_optimizer, di, calls=3):
    """Per backend: each call's outputs and (loss_scaling, finite steps, skipped steps) after it,
    the final parameters, the executor. Call 0 has a huge target at ``OVERFLOW_STEP``."""
    results = {}
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = make_model()
        pop = poptorch.trainingModel(model, make_options(backend), make_optimizer(model))
        outs = []
        for call in range(calls):
            x, t = make_data(di * 2 * 2, seed=call)
            if call == 0:
                t[OVERFLOW_STEP * 4 + 1] *= 3000.0
            outs.append(pop(x, t))
            dynamic = pop._precision.dynamic
            counts = (dynamic.finite_steps, dynamic.skipped_steps) if dynamic else ()
            outs[-1] += (pop._optimizer.loss_scaling, *counts, *(pop.getAnchoredTensor(n) for n in ANCHORS))
        assert pop._dispatch.compiled.last == backend
        results[backend] = outs, [p.detach().clone() for p in model.parameters()], pop
    return results


def assert_same(results, rtol, atol):
    for eager, compiled in zip(results["eager"][0], results["compiled"][0]):
        for a, b in zip(eager, compiled):
            if isinstance(a, torch.Tensor):
                assert a.dtype == b.dtype and a.shape == b.shape
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)  # skipped step's
            else:
                assert a == b  # loss scaling, finite and skipped steps
    for a, b in zip(results["eager"][1], results["compiled"][1]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,automatic", [(torch.bfloat16, False), (torch.float16, True)])
def test_autocast_matches_eager(monkeypatch, dtype, automatic):
    """Autocast over DI=4 x GA=2, the forward traced under autocast inside while_loop's body
    (``OPENPOP_HALF_COMPUTE=native``: no ``LowPrecisionOps``, as on CPUs with fast half); float16
    with automatic loss scaling (Lightning's ``16-mixed``): a skipped step and growth."""
    monkeypatch.setenv("OPENPOP_HALF_COMPUTE", "native")

    def make_options(backend):
        opts = options(backend, di=4)
        opts.Precision.autocast(True, dtype)
        opts.Training.setAutomaticLossScaling(automatic, growth_interval=2)
        return opts

    results = run_both(Regressor, make_options,
                       lambda m: poptorch.optim.AdamW(m.parameters(), lr=0.01, loss_scaling=2.0 ** 10), di=4)
    output, loss = results["compiled"][0][0][:2]
    assert output.dtype == dtype and loss.dtype == torch.float32  # autocast's dtype flow
    anchored = results["compiled"][0][0][-len(ANCHORS):]
    assert [tuple(a.shape) for a in anchored] == [(4, 8, 6), (2, 2), (2,), (8,), (2, 8)]
    assert not results["compiled"][2]._dispatch.compiled._program.stepwise
    if automatic:
        assert [out[2:5] for out in results["compiled"][0]] == [(1024.0, 1, 1), (4096.0, 1, 1), (16384.0, 1, 1)]
    assert_same(results, rtol=1e-2, atol=1e-3)


def test_half_weights_and_automatic_loss_scaling_match_eager():
    """A float16 model (float32 inputs: PopTorch's upcast) with float16 optimizer state and automatic
    loss scaling over DI=4: ``LowPrecisionOps`` in the traced forward, so the host loops over
    one-step programs; updates in float32 rounded to float16, half intermediates rounded as eager
    rounds them, the overflowing step skipped (bit for bit on this machine; checked to within
    float16 rounding, as float32 forward fusions may differ elsewhere)."""
    def make_options(backend):
        opts = options(backend, di=4)
        opts.Training.setAutomaticLossScaling(True, growth_interval=2)
        return opts

    def make_optimizer(model):
        return poptorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, use_combined_accum=True,
                                  accum_type=torch.float16, loss_scaling=2.0 ** 10)

    from torch._dynamo.utils import counters
    traced = counters["stats"]["unique_graphs"]
    results = run_both(lambda: Regressor().half(), make_options, make_optimizer, di=4)
    assert results["compiled"][2]._dispatch.compiled._program.stepwise
    # One trace serves every step: the first step takes plain tensors too, not Parameters.
    assert counters["stats"]["unique_graphs"] - traced == 1
    assert [out[2:5] for out in results["compiled"][0]] == [(1024.0, 1, 1), (4096.0, 1, 1), (16384.0, 1, 1)]
    assert_same(results, rtol=1e-3, atol=1e-4)
    eager, compiled = (results[b][2]._optimizer.state_dict()["state"] for b in ("eager", "compiled"))
    for index in eager:
        assert compiled[index]["momentum_buffer"].dtype == torch.float16
        torch.testing.assert_close(compiled[index]["momentum_buffer"], eager[index]["momentum_buffer"],
                                   rtol=1e-3, atol=1e-4)


def test_compile_options_for_half_programs():
    """Half programs round like eager (``emulate_precision_casts``); stepwise ones have no loop for
    Inductor's C++ wrapper; CUDA keeps its graphs."""
    from types import SimpleNamespace

    from openpop.runtime.compiled.program_options import compile_kwargs
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    loop = SimpleNamespace(device_iterations=4, micro_batches_per_step=1)
    cacheable = {"unsafe_marked_cacheable_functions": {"torch.ops.higher_order.while_loop": torch.__version__}}
    assert compile_kwargs(cpu, loop, False, half_casts=True) == {
        "options": {"cpp_wrapper": True, "cpp_wrapper_build_separate": True, **cacheable,
                    "emulate_precision_casts": True}}
    assert compile_kwargs(cpu, loop, False, half_casts=True, loops=False) == {
        "options": {"emulate_precision_casts": True}}
    assert compile_kwargs(cuda, loop, False, half_casts=True) == {
        "options": {"triton.cudagraphs": True, **cacheable, "emulate_precision_casts": True}}


def test_anchored_gradient_of_a_weight_outside_the_optimizer_is_declined():
    """The program computes the optimizer's gradients only: forced compiled raises before changing
    anything (eager would anchor the gradient of ``fc2.bias``, which it does not update)."""
    model = Regressor()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opts = options("compiled", di=1)
    opts.anchorTensor("grad", "Gradient___fc2.bias")
    optimizer = poptorch.optim.SGD([model.fc1.weight, model.fc1.bias, model.fc2.weight], lr=0.1)
    pop = poptorch.trainingModel(model, opts, optimizer)
    with pytest.raises(poptorch.Error, match="anchored gradient of fc2.bias"):
        pop(*make_data(4))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])


class Normed(Regressor):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(6)

    def forward(self, x, target):
        return super().forward(self.norm(x), target)


def test_anchored_buffer_the_forward_updates_is_declined_unless_final():
    """Its per-step values are not reported: only ``Final`` (read after the call) runs compiled."""
    model = Normed()
    opts = poptorch.Options().deviceIterations(2).openpopBackend("compiled")
    opts.anchorTensor("mean", "norm.running_mean", poptorch.OutputMode.All)
    pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    before = model.norm.running_mean.clone()
    with pytest.raises(poptorch.Error, match="buffer norm.running_mean, updated by the forward pass"):
        pop(*make_data(8))
    assert torch.equal(model.norm.running_mean, before)
