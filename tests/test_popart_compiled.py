"""PopART sessions on openpop's compiled backend (issue 31, item 2): with the backend left to
``auto``, ``prepareDevice`` compiles the session's whole step (batchesPerStep x accumulation x
replication) and ``run`` runs the program; the numbers are the eager session's. Sessions that
record on the host during the step (gradient and ``UpdatedVar`` anchors) stay eager, and a graph
the compiled backend declines keeps running exactly the eager Python it ran before (item 3)."""
import collections

import numpy as np
import pytest

import popart

from helpers.call_counts import calls_made
from helpers.popart_models import build_mlp, mlp_weights

MB = 4


def _training_session(anchors, *, bps, accl=1, repl=1, momentum=False):
    weights = mlp_weights()
    builder, x, labels, probs, loss, ids = build_mlp(MB, weights)
    opts = popart.SessionOptions()
    if accl > 1:
        opts.enableGradientAccumulation = True
        opts.accumulationFactor = accl
    if repl > 1:
        opts.enableReplicatedGraphs = True
        opts.replicatedGraphCount = repl
    values = {"defaultLearningRate": (0.05, False)}
    if momentum:
        values["defaultMomentum"] = (0.9, True)
    named = {"loss": loss, "probs": probs}
    session = popart.TrainingSession(
        fnModel=builder.getModelProto(), loss=loss, optimizer=popart.SGD(values), userOptions=opts,
        dataFlow=popart.DataFlow(bps, {named.get(k, k): popart.AnchorReturnType(*art) for k, art in anchors.items()}),
        deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": repl}))
    session.prepareDevice()
    session.weightsFromHost()
    return session, x, labels, named, ids


def _train(backend, monkeypatch, anchors, *, bps, accl=1, repl=1, momentum=False, steps=2):
    """Anchors and final weights after ``steps`` runs; ``backend``: "eager", or None (the session's
    own choice: compiled)."""
    if backend is None:
        monkeypatch.delenv("OPENPOP_BACKEND", raising=False)
        monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    else:
        monkeypatch.setenv("OPENPOP_BACKEND", backend)
    session, x, labels, named, ids = _training_session(anchors, bps=bps, accl=accl, repl=repl, momentum=momentum)
    rng = np.random.default_rng(3)
    results = []
    for _ in range(steps):
        shape = [n for n in (bps, accl, repl) if n > 1]
        data = rng.standard_normal(shape + [MB, 8]).astype(np.float32)
        lab = rng.integers(0, 4, shape + [MB]).astype(np.int32)
        arrays = session.initAnchorArrays()
        session.run(popart.PyStepIO({x: data, labels: lab}, arrays))
        results.append({k: arrays[named.get(k, k)].copy() for k in anchors})
    session.weightsToHost()
    out = {i: np.zeros_like(w) for i, w in zip(ids, [a for wb in mlp_weights() for a in wb])}
    session.readWeights(popart.PyWeightsIO(out))
    return session, results, out


@pytest.mark.slow
@pytest.mark.parametrize("anchors,bps,accl,repl,momentum", [
    ({"loss": ("All",)}, 4, 2, 1, True),  # the runtime's output mode All
    ({"loss": ("Final",), "probs": ("Final",)}, 3, 1, 2, False),  # Final: only the last step's values kept
    ({"probs": ("EveryN", 2)}, 4, 1, 1, False),
    ({"loss": ("Sum",)}, 2, 2, 1, False),
    ({"loss": ("All",), "w0": ("Final",)}, 2, 1, 1, False),  # mixed: All, reduced by the session
])
def test_a_compiled_training_session_computes_what_the_eager_one_does(monkeypatch, one_thread, anchors, bps, accl,
                                                                      repl, momentum):
    _, eager, eager_weights = _train("eager", monkeypatch, anchors, bps=bps, accl=accl, repl=repl, momentum=momentum)
    session, compiled, compiled_weights = _train(None, monkeypatch, anchors, bps=bps, accl=accl, repl=repl,
                                                 momentum=momentum)
    assert session.executor._dispatch.compiled.last == "compiled"
    for want, got in zip(eager, compiled):
        for name in anchors:
            assert got[name].shape == want[name].shape, name
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for name in eager_weights:
        np.testing.assert_allclose(compiled_weights[name], eager_weights[name], rtol=1e-5, atol=1e-6, err_msg=name)


def _half_inference(bps):
    """Graphcore's sharding example's graph, smaller: two float16 Gemm layers on two virtual
    graphs, the output anchored Final."""
    builder = popart.Builder()
    rng = np.random.default_rng(42)
    x = builder.addInputTensor(popart.TensorInfo("FLOAT16", [3, 16]))
    out = x
    for i in range(2):
        with builder.virtualGraph(i):
            w = builder.addInitializedInputTensor(rng.normal(0, 0.5, [16, 16]).astype(np.float16))
            b = builder.addInitializedInputTensor(rng.normal(0, 0.5, [16]).astype(np.float16))
            out = builder.aiOnnx.gemm([out, w, b])
    builder.addOutputTensor(out)
    opts = popart.SessionOptions()
    opts.virtualGraphMode = popart.VirtualGraphMode.Manual
    session = popart.InferenceSession(fnModel=builder.getModelProto(), userOptions=opts,
                                      dataFlow=popart.DataFlow(bps, {out: popart.AnchorReturnType("FINAL")}),
                                      deviceInfo=popart.DeviceManager().createIpuModelDevice({"numIPUs": 2}))
    session.prepareDevice()
    session.weightsFromHost()
    data = rng.uniform(-1, 1, [bps, 3, 16]).astype(np.float16)
    arrays = session.initAnchorArrays()
    session.run(popart.PyStepIO({x: data}, arrays))
    return session, arrays[out]


@pytest.mark.slow
def test_a_compiled_half_precision_sharded_inference_session_computes_what_the_eager_one_does(monkeypatch, one_thread):
    monkeypatch.setenv("OPENPOP_BACKEND", "eager")
    _, eager = _half_inference(5)
    monkeypatch.delenv("OPENPOP_BACKEND")
    monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    session, compiled = _half_inference(5)
    assert session.executor._dispatch.compiled.last == "compiled"
    assert compiled.dtype == np.float16 and compiled.shape == eager.shape == (3, 16)
    # Within float16's rounding (Inductor keeps a fused kernel's intermediates in float32)
    np.testing.assert_allclose(compiled.astype(np.float32), eager.astype(np.float32), rtol=4e-3, atol=4e-3)
    # The graph applies the half-precision rules itself (graph.py): the program loops over the steps
    assert session.executor.model.computes_low_precision


def test_a_half_precision_graph_computes_its_gemms_as_float32_partials_rounded_once(monkeypatch):
    """float16 operands, float32 accumulation, one rounding to float16 per Gemm (where this CPU's
    float16 GEMMs are slow, as the runtime's rule; else natively): within float16's rounding of
    the float32 computation."""
    monkeypatch.setenv("OPENPOP_BACKEND", "eager")
    session, got = _half_inference(2)
    rng = np.random.default_rng(42)
    w0, b0 = rng.normal(0, 0.5, [16, 16]).astype(np.float16), rng.normal(0, 0.5, [16]).astype(np.float16)
    w1, b1 = rng.normal(0, 0.5, [16, 16]).astype(np.float16), rng.normal(0, 0.5, [16]).astype(np.float16)
    x = rng.uniform(-1, 1, [2, 3, 16]).astype(np.float16)[-1]
    h = (x.astype(np.float32) @ w0.astype(np.float32) + b0).astype(np.float16)
    want = (h.astype(np.float32) @ w1.astype(np.float32) + b1).astype(np.float16)
    assert session.executor.model.computes_low_precision
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_sessions_that_record_on_the_host_during_the_step_stay_eager(monkeypatch):
    monkeypatch.delenv("OPENPOP_BACKEND", raising=False)
    monkeypatch.delenv("OPENPOP_COMPILE_AFTER", raising=False)
    for anchor in (popart.reservedGradientPrefix() + "w0", popart.reservedUpdatedVarPrefix() + "w0"):
        session, *_ = _training_session({"loss": ("All",), anchor: ("All",)}, bps=1)
        assert session.executor._dispatch.compiled.selection.backend == "eager"


def test_the_environment_still_chooses_the_backend(monkeypatch):
    monkeypatch.setenv("OPENPOP_BACKEND", "eager")  # (the suite's default: conftest.py)
    session, *_ = _training_session({"loss": ("All",)}, bps=1)
    assert session.executor._dispatch.compiled.selection.backend == "eager"


def test_popart_engine_caching_is_the_executable_cache_in_its_cache_path(tmp_path):
    def session(**settings):
        builder = popart.Builder()
        x = builder.addInputTensor(popart.TensorInfo("FLOAT", [2]))
        out = builder.aiOnnx.relu([x])
        options = popart.SessionOptions()
        for name, value in settings.items():
            setattr(options, name, value)
        dataflow = popart.DataFlow(1, {out: popart.AnchorReturnType("All")})
        made = popart.InferenceSession(builder.getModelProto(), dataflow, popart.DeviceManager().createCpuDevice(),
                                       userOptions=options)
        made.prepareDevice()
        return made.executor._compile_cache

    cache = session(enableEngineCaching=True, cachePath=str(tmp_path / "engines"))
    assert cache.path == str(tmp_path / "engines") and not cache.managed
    assert session(cachePath=str(tmp_path / "unused")) is None  # not enabled: openpop's default (off in the suite)


@pytest.mark.slow
def test_a_declined_popart_graph_keeps_its_eager_host_call(monkeypatch, capsys):
    """Issue 31, item 3: a PopART graph torch.compile rejects (a PrintTensor in the step: Dynamo
    cannot trace print inside the step's loop) runs, after the declined compile, exactly the
    Python it ran before it - counted, not timed."""
    monkeypatch.delenv("OPENPOP_BACKEND", raising=False)
    monkeypatch.setenv("OPENPOP_COMPILE_AFTER", "1e9")  # auto, eager until told to compile
    builder = popart.Builder()
    x = builder.addInputTensor(popart.TensorInfo("FLOAT", [4, 3]), "x")
    w = builder.addInitializedInputTensor(np.ones([3, 3], np.float32), "w")
    out = builder.aiGraphcore.printtensor([builder.aiOnnx.matmul([x, w])])
    dataflow = popart.DataFlow(3, {out: popart.AnchorReturnType("All")})
    session = popart.InferenceSession(builder.getModelProto(), dataflow, popart.DeviceManager().createCpuDevice())
    session.prepareDevice()
    session.weightsFromHost()
    data = np.ones([3, 4, 3], np.float32)
    arrays = session.initAnchorArrays()

    def run():
        session.run(popart.PyStepIO({x: data}, arrays))

    backend = session.executor._dispatch.compiled
    run()
    run()
    before = calls_made(run, c_functions=True)
    backend.selection.compile_after = 0.0  # the next call compiles: torch.compile rejects the graph
    run()
    assert backend.selection.declined and backend.last == "eager"
    run()
    after = calls_made(run, c_functions=True)
    capsys.readouterr()
    assert after - before == collections.Counter()
    assert sum((before - after).values()) <= 4  # (the rental's checks, no longer made)
    np.testing.assert_array_equal(arrays[out], np.full([3, 4, 3], 3.0, np.float32))
