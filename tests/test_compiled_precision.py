"""The compiled backend with reduced precision: autocast, half weights, automatic loss scaling -
each against the eager backend, host call by host call (README "Compiled backend")."""
import pytest
import torch

import poptorch

from helpers.models import Regressor, make_data

pytestmark = pytest.mark.usefixtures("one_thread")


def options(backend, di=2, ga=2):
    opts = poptorch.Options().deviceIterations(di).openpopBackend(backend)
    opts.Training.gradientAccumulation(ga)
    opts.showCompilationProgressBar(False)
    return opts


def run_both(make_model, make_options, make_optimizer, calls, rows):
    """Per backend: the outputs of ``calls`` host calls, the final parameters, the executor."""
    results = {}
    for backend in ("eager", "compiled"):
        torch.manual_seed(0)
        model = make_model()
        pop = poptorch.trainingModel(model, make_options(backend), make_optimizer(model))
        outs = [pop(*make_data(rows, seed=call)) for call in range(calls)]
        assert pop._backend.last == backend
        results[backend] = outs, [p.detach().clone() for p in model.parameters()], pop
    return results


def assert_same(results, rtol, atol):
    for eager, compiled in zip(results["eager"][0], results["compiled"][0]):
        for a, b in zip(eager, compiled):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    for a, b in zip(results["eager"][1], results["compiled"][1]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def test_autocast_matches_eager(monkeypatch):
    """bf16 autocast over DI=2 x GA=2, with the half matmuls computed in float32 as eager does where
    they are slow (``OPENPOP_HALF_COMPUTE=float32``: ``LowPrecisionOps`` around the whole program)."""
    monkeypatch.setenv("OPENPOP_HALF_COMPUTE", "float32")

    def make_options(backend):
        opts = options(backend)
        opts.Precision.autocast(True, torch.bfloat16)
        return opts

    results = run_both(Regressor, make_options, lambda m: poptorch.optim.AdamW(m.parameters(), lr=0.01),
                       calls=2, rows=8)
    output, loss = results["compiled"][0][0]
    assert output.dtype == torch.bfloat16 and loss.dtype == torch.float32  # autocast's dtype flow
    assert_same(results, rtol=1e-2, atol=1e-3)
