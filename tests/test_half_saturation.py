"""Float16 overflow saturates at +-65504, as on the IPU (runtime/half_saturation.py): in the
forward, the backward (the loss-scaled seed included) and the optimizer step; the same in the
compiled program; not with floating-point exceptions, automatic loss scaling or
OPENPOP_HALF_OVERFLOW=inf."""
import copy
import json

import pytest
import torch

import poptorch
from openpop.runtime import half_saturation

MAX = 65504.0


class Scaled(torch.nn.Module):
    """``sum(w * x) * k``: with ``k`` large the forward overflows float16."""

    def __init__(self, k=1.0):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), 0.5))
        self.k = k

    def forward(self, x):
        y = self.w * x * self.k
        return y, poptorch.identity_loss(y.sum(), reduction="sum")


def options(backend="eager", di=1):
    opts = poptorch.Options().deviceIterations(di).openpopBackend(backend)
    opts.showCompilationProgressBar(False)
    return opts


@pytest.mark.parametrize("backend", ["eager", "compiled"])
def test_forward_overflow_saturates(backend):
    model = Scaled(k=1024.0).half()
    pop = poptorch.inferenceModel(model, options(backend))
    x = torch.tensor([[128.0, -128.0, 1.0, float("inf")]]).half()
    y, loss = pop(x)
    # 0.5 * 128 * 1024 = 65536 > 65504; arithmetic on an inf operand is clamped too (module docstring)
    assert y[0].tolist() == [MAX, -MAX, 512.0, MAX]
    assert loss.item() == MAX  # 65504 - 65504 + 512 + 65504 overflows: saturated


@pytest.mark.parametrize("backend", ["eager", "compiled"])
def test_loss_scale_beyond_float16_saturates_the_backward_seed(backend):
    """MAE's configurations: a float16 loss scaled by 2**23. IEEE arithmetic seeds the backward
    with inf (NaN weights after one step); saturated, the seed is 65504 and SGD steps by
    lr * 65504 * x / 2**23. The hand computation is the oracle."""
    model = Scaled().half()
    scale = 2.0 ** 23
    pop = poptorch.trainingModel(model, options(backend), poptorch.optim.SGD(model.parameters(), lr=1.0,
                                                                            loss_scaling=scale))
    x = torch.tensor([[0.25, 0.5, -0.5, 0.125]]).half()
    pop(x)
    grad = (torch.tensor(MAX).half() * x[0]).float() / scale  # d(sum(w*x)*seed)/dw, unscaled
    expected = (torch.full((4,), 0.5) - grad).half()
    assert torch.equal(model.w.detach(), expected)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x, t):
        h = torch.relu(self.fc1(x)) * 64.0  # activations and their gradients near float16's limit
        out = self.fc2(h)
        return out, poptorch.identity_loss((out * t).mean(), reduction="mean")


def test_compiled_program_saturates_as_eager(monkeypatch):
    """Overflow in forward and backward, over DI 2 x GA 2: the compiled program's clamps are
    eager's, bit for bit. (Where an op that eager runs as one kernel overflows inside - an
    ``mse_loss`` squaring a large difference - the program's decomposed ops clamp the
    intermediate and eager does not: such overflow is kept out of the comparison.)"""
    torch.manual_seed(0)
    model = Net().half()
    with torch.no_grad():
        model.fc1.weight.mul_(20)

    def train(backend):
        m = copy.deepcopy(model)
        opts = options(backend, di=2)
        opts.Training.gradientAccumulation(2)
        pop = poptorch.trainingModel(m, opts, poptorch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9,
                                                                 loss_scaling=512.0))
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            pop(torch.randn(8, 8, generator=g).half() * 4, torch.randn(8, 4, generator=g).half())
        if backend == "compiled":
            assert pop._dispatch.compiled.last == "compiled"
        return list(m.parameters())

    eager, compiled = train("eager"), train("compiled")
    for name, a, b, before in zip(["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], eager, compiled,
                                  model.parameters()):
        assert torch.isfinite(a).all() and not torch.equal(a, before), name
        assert torch.equal(a, b), name
    monkeypatch.setenv("OPENPOP_HALF_OVERFLOW", "inf")  # the run really overflowed: IEEE's gives NaN
    assert not torch.isfinite(train("eager")[0]).all()


def test_explicit_infinities_pass_through_selections():
    """A -inf mask is a value the model gave, not an overflow: where/masked_fill keep it."""

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4).half())

        def forward(self, x, mask):
            return x.masked_fill(mask, float("-inf")) * 1, torch.where(mask, float("-inf"), x * self.w)

    x = torch.ones(1, 4).half()
    mask = torch.tensor([[True, False, False, True]])
    arithmetic, selected = poptorch.inferenceModel(Masked(), options())(x, mask)
    assert selected[0].tolist() == [float("-inf"), 1.0, 1.0, float("-inf")]
    assert arithmetic[0].tolist() == [-MAX, 1.0, 1.0, -MAX]  # (x * 1 is arithmetic)


def test_ieee_overflow_where_saturation_does_not_apply(monkeypatch):
    x = torch.tensor([[100.0, 100.0, 1.0, 1.0]]).half()
    monkeypatch.setenv("OPENPOP_HALF_OVERFLOW", "inf")
    y, _ = poptorch.inferenceModel(Scaled(k=10000.0).half(), options())(x)
    assert y[0, 0] == float("inf")
    monkeypatch.delenv("OPENPOP_HALF_OVERFLOW")
    opts = options()
    opts.Precision.enableFloatingPointExceptions(True)  # then overflow is an error (the IPU's NaN-on-overflow)
    with pytest.raises(poptorch.Error, match="overflow"):
        poptorch.inferenceModel(Scaled(k=10000.0).half(), opts)(x)
    y, _ = poptorch.inferenceModel(Scaled(k=10000.0).bfloat16(), options())(x.bfloat16())
    assert y[0, 0] == 500000.0  # bfloat16 has float32's range: nothing to saturate


def test_automatic_loss_scaling_keeps_ieee_overflow():
    model = Scaled().half()
    opts = options()
    opts.Training.setAutomaticLossScaling(True)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=1.0, loss_scaling=2.0 ** 23)
    pop = poptorch.trainingModel(model, opts, optimizer)
    pop(torch.tensor([[0.25, 0.5, -0.5, 0.125]]).half())
    assert optimizer.loss_scaling == 2.0 ** 22  # it saw the overflow: step skipped, scale halved
    assert torch.equal(model.w.detach(), torch.full((4,), 0.5).half())


def test_bad_setting_names_the_values(monkeypatch):
    monkeypatch.setenv("OPENPOP_HALF_OVERFLOW", "clip")
    with pytest.raises(ValueError, match="OPENPOP_HALF_OVERFLOW='clip' is not valid: set it to saturate or inf"):
        poptorch.inferenceModel(Scaled().half(), options())


_H, _F = torch.empty(1, dtype=torch.float16), torch.empty(1)
_aten = torch.ops.aten


@pytest.mark.parametrize("op, operands, computes", [
    (_aten.mul.Tensor, (), True), (_aten.addmm.default, (), True), (_aten.sum.dim_IntList, (), True),
    (_aten.scatter.reduce, (), True), (_aten._to_copy.default, (_F,), True), (_aten.copy_.default, (_H, _F), True),
    (_aten.index_put_.default, (_H, [None], _H, True), True),
    (_aten.where.self, (), False), (_aten.masked_fill.Scalar, (), False), (_aten.cat.default, (), False),
    (_aten.view.default, (), False), (_aten.scatter.src, (), False), (_aten.full.default, (), False),
    (_aten._to_copy.default, (_H,), False), (_aten.copy_.default, (_H, _H), False),
    (_aten.index_put_.default, (_H, [None], _H), False),
], ids=lambda v: str(v) if isinstance(v, (bool, torch._ops.OpOverload)) else "")
def test_which_ops_compute_values(op, operands, computes):
    """Arithmetic clamps; selections, views and copies between float16 tensors keep values (a
    -inf written into a float16 tensor stays -inf); a conversion to float16 and an accumulating
    index_put clamp."""
    assert half_saturation.computes_values(op, operands) is computes


def test_regions_leave_saturating_models_to_the_program():
    """Eager's saturating mode would run compiled regions eagerly (Dynamo does not compile under a
    dispatch mode): the unit 'regions' declines such a model, with the way out."""
    model = Scaled().half()
    opts = poptorch.Options().openpopBackend("compiled", unit="regions")
    pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.Error, match="'regions' for a model computing in float16.*OPENPOP_HALF_OVERFLOW=inf"):
        pop(torch.ones(1, 4).half())


class Growing(torch.nn.Module):
    """Overflows float16 once its input is large enough; dropout draws from torch's generator
    and a buffer counts the forwards, so a call run twice would show."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.25)
        self.register_buffer("forwards", torch.zeros((), dtype=torch.float16))

    def forward(self, x):
        self.forwards += 1
        y = self.drop(self.fc(x)) * 256.0
        return y, poptorch.identity_loss(y.sum(), reduction="sum")


@pytest.mark.parametrize("training", [True, False])
def test_eager_runs_a_call_again_saturating_when_it_overflows(training, caplog, monkeypatch):
    """Eager runs float16 models without its saturating mode (a cost on every op) until a call
    overflows; that call is rolled back and runs again saturating, as do all later calls. The
    oracle: the same executor saturating from the start (which it does when calls cannot be
    rolled back)."""
    monkeypatch.setattr(poptorch.logger, "propagate", True)
    torch.manual_seed(0)
    model = Growing().half()
    x = torch.randn(6, 4).half()
    inputs = [x, x * 1000, x]  # the second call overflows (in its second step, when training)
    runs = {}
    for watched in [True, False]:
        m = copy.deepcopy(model)
        opts = options(di=3)
        opts.randomSeed(0)
        if training:
            opts.Training.rollbackFailedCalls(watched)
            pop = poptorch.trainingModel(m, opts, poptorch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9))
        else:
            m.eval()
            pop = poptorch.inferenceModel(m, opts)
        if not watched and not training:
            pop._precision.overflow_seen = True
        torch.manual_seed(1)
        outputs = []
        for call, batch in enumerate(inputs):
            with caplog.at_level("INFO", logger=poptorch.logger.name):
                outputs.append(pop(batch)[0])
            if watched:
                assert pop._precision.overflow_seen == (call >= 1), call
        runs[watched] = outputs, [t.detach().clone() for t in m.state_dict().values()], torch.get_rng_state()
    (out_w, state_w, rng_w), (out_s, state_s, rng_s) = runs[True], runs[False]
    for a, b in zip(out_w + state_w, out_s + state_s):
        assert torch.equal(a, b)
    assert torch.equal(rng_w, rng_s)
    if training:  # one forward per micro-batch: no call ran twice ("forwards" comes first)
        assert state_w[0].item() == 3 * 3  # one forward per micro-batch: no call ran twice
    assert isinstance(out_w[1], torch.Tensor) and out_w[1].abs().max() == MAX
    assert sum("float16 overflow" in r.getMessage() for r in caplog.records) == 1


def test_lightning_call_run_again_logs_and_schedules_once():
    """A Lightning host call (2 device iterations) whose second step overflows runs again
    saturating: what its first run logged (inf, NaN) is dropped and its first step's LR scheduler
    step is undone; logs, learning rates and weights equal a run saturating from the start."""
    pl = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.strategies import IPUStrategy

    import openpop.lightning  # noqa: F401  (IPUStrategy)

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
            self.seen = []

        def training_step(self, batch, batch_idx):
            y = self.fc(batch[0]) * 256.0
            self.log("ymax", y.float().abs().max(), reduce_fx="max")
            return y.float().mean()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.seen.append((float(self.trainer.callback_metrics["ymax"]),
                              self.trainer.optimizers[0].param_groups[0]["lr"]))

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1e-6)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    x[4:8] *= 1000  # the second step of the first host call overflows
    runs = []
    for watched in (True, False):
        torch.manual_seed(1)
        module = Module().half()
        opts = poptorch.Options()
        opts.Training.rollbackFailedCalls(watched)  # (off: saturating from the start)
        trainer = pl.Trainer(accelerator="ipu", devices=1, max_steps=4, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, enable_checkpointing=False,
                             strategy=IPUStrategy(device_iterations=2, training_opts=opts))
        trainer.fit(module, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.half()), batch_size=4))
        runs.append((module.seen, module.fc.weight.detach().clone(),
                     trainer.lr_scheduler_configs[0].scheduler.last_epoch))
    assert runs[0][0] == runs[1][0] and runs[0][0][0][0] == MAX
    assert runs[0][2] == runs[1][2] == 4
    assert torch.equal(runs[0][1], runs[1][1])


def test_concurrent_pipeline_stages_saturate(monkeypatch):
    """Pipelined stages running micro-batches on threads of their own enter the saturating mode
    too (a dispatch mode is per thread): the run equals one on a single thread."""

    class Staged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = poptorch.BeginBlock(torch.nn.Linear(4, 4), ipu_id=0)
            self.second = poptorch.BeginBlock(torch.nn.Linear(4, 4), ipu_id=1)

        def forward(self, x):
            y = self.second(self.first(x) * 256.0) * 256.0
            return y, poptorch.identity_loss(y.float().mean(), reduction="mean")

    torch.manual_seed(0)
    model = Staged().half()
    x = torch.randn(2 * 4 * 2, 4, generator=torch.Generator().manual_seed(0)).half()
    x[8:] *= 100  # the second step overflows
    weights = {}
    for concurrency in ("on", "off"):
        monkeypatch.setenv("OPENPOP_CONCURRENT_STAGES", concurrency)
        m = copy.deepcopy(model)
        opts = options(di=2)
        opts.Training.gradientAccumulation(4)
        opts.setExecutionStrategy(poptorch.PipelinedExecution())
        pop = poptorch.trainingModel(m, opts, poptorch.optim.SGD(m.parameters(), lr=1e-6))
        pop(x)
        assert pop._executable.concurrent == (concurrency == "on") and pop._precision.overflow_seen
        weights[concurrency] = [p.detach().clone() for p in m.parameters()]
    for a, b in zip(weights["on"], weights["off"]):
        assert torch.isfinite(a).all() and torch.equal(a, b)


def test_a_call_run_again_is_one_call_in_the_trace(tmp_path, monkeypatch, no_environment_session):
    """The rerun of an overflowing call is part of that call: the report numbers the host calls
    as the user made them."""
    directory = tmp_path / "report"
    monkeypatch.setenv("POPLAR_ENGINE_OPTIONS", json.dumps(
        {"autoReport.all": "true", "autoReport.directory": str(directory),
         "autoReport.executionProfileProgramRunCount": 3}))
    torch.manual_seed(0)
    model = Growing().half()
    pop = poptorch.trainingModel(model, options(di=3), poptorch.optim.SGD(model.parameters(), lr=1e-3))
    x = torch.randn(6, 4).half()
    for batch in (x, x * 1000, x):  # the second call overflows and runs again
        pop(batch)
    assert pop._precision.overflow_seen
    report = json.loads((directory / "training" / "report.json").read_text())
    assert [c["call"] for c in report["host_calls"]] == [0, 1, 2]
    pop.destroy()
    events = json.loads((directory / "training" / "trace.json").read_text())["traceEvents"]
    steps = [e["args"]["step"] for e in events if e.get("cat") == "openpop_stage"]
    assert steps and max(steps) == 2, sorted(set(steps))  # DI 3: the rerun numbers its steps from 0 again
