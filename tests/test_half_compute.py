"""Half-precision models on CPUs: mixed float32/float16 operands resolved as PopTorch does, and
half matmuls/convolutions computed natively or in float32 by the per-device policy
(``OPENPOP_HALF_COMPUTE``) - both paths forced here whatever this CPU is."""
import copy
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode

import poptorch
from openpop.log import logger
from openpop.runtime import half_compute
from openpop.runtime.half_compute import (
    CONVOLUTION,
    MATMUL,
    CpuHalfSpeeds,
    HalfComputePolicy,
    LowPrecisionOps,
    low_precision_is_faster,
    measure_cpu_rates,
)

from helpers.oracle import micro_batches

LOW = [torch.float16, torch.bfloat16]


class ConvNet(torch.nn.Module):
    """Linear, Conv1d, LayerNorm, bmm and a loss: the op families the policy covers."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 24)
        self.conv = torch.nn.Conv1d(1, 2, 3, padding=1)
        self.norm = torch.nn.LayerNorm(48)
        self.fc2 = torch.nn.Linear(48, 4)

    def forward(self, x, y):
        h = F.relu(self.fc1(x))
        h = self.conv(h[:, None]).flatten(1)
        h = torch.bmm(h[:, :, None], h[:, None, :]).mean(-1) + h  # a batched matmul
        out = self.fc2(self.norm(h))
        return out, F.cross_entropy(out, y)


def make_data(rows, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 16, generator=g)
    return x, x[:, :4].argmax(dim=1)


def options(di=1, ga=1):
    opts = poptorch.Options().deviceIterations(di).outputMode(poptorch.OutputMode.All)
    opts.Training.gradientAccumulation(ga)
    opts.showCompilationProgressBar(False)
    return opts


class KernelDtypes(TorchDispatchMode):
    """Records the operand dtypes of every matmul/convolution/attention kernel that runs (forward
    and backward)."""

    KERNELS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "convolution_backward", "mkldnn_rnn_layer",
               "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.KERNELS:  # operands first (attention's backward adds float32 stats)
            floating = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            self.seen.add(tuple(floating[:3]))
        return func(*args, **(kwargs or {}))

    def dtypes(self):
        return {dtype for operands in self.seen for dtype in operands}


@pytest.fixture
def half_compute_setting(monkeypatch):
    def set_to(value):
        monkeypatch.setenv(half_compute.SETTING_ENV, value)
    return set_to


# ------------------------------------------------------------------ mixed float32 / half operands
def _upcasting_loop(model, optimizer, x, y, di, ga):
    """The oracle for a half model fed float32 inputs: the forward on float32 copies of the half
    parameters (what promoting every mixed op computes), gradients flowing back to them."""
    xs, ys = micro_batches(x, di, ga, 1), micro_batches(y, di, ga, 1)
    losses, outputs = [], []
    for d in range(di):
        optimizer.zero_grad(set_to_none=True)
        for g in range(ga):
            params = {name: p.float() for name, p in model.named_parameters()}
            out, loss = functional_call(model, params, (xs[d][g][0], ys[d][g][0]))
            (loss / ga).backward()
            losses.append(loss.detach())
            outputs.append(out.detach())
        optimizer.step()
    return torch.cat(outputs), torch.stack(losses)


@pytest.mark.parametrize("dtype", LOW)
def test_half_model_fed_float32_inputs_trains_like_an_upcasting_loop(dtype):
    """PopTorch 3 upcasts ops with float32 and float16 operands: the model computes in float32,
    returns float32 outputs and losses, and its half parameters train - here with automatic loss
    scaling and half partials, as IPU scripts set them."""
    base = ConvNet().to(dtype)
    model, reference = copy.deepcopy(base), copy.deepcopy(base)
    x, y = make_data(4 * 2 * 6)
    opts = options(di=4, ga=2)
    opts.Training.setAutomaticLossScaling(True)
    opts.Precision.setPartialsType(torch.half)
    pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.05))
    out, losses = pop(x, y)
    assert out.dtype == torch.float32 and losses.dtype == torch.float32
    assert all(p.dtype == dtype for p in model.parameters())
    ref_out, ref_losses = _upcasting_loop(reference, torch.optim.SGD(reference.parameters(), lr=0.05), x, y, 4, 2)
    # The first step is the same arithmetic; later ones differ by how each optimizer rounds the
    # half update (poptorch's optimizers compute it in float32).
    assert torch.equal(out[:12], ref_out[:12]) and torch.equal(losses[:2], ref_losses[:2])
    tol = 2e-3 if dtype == torch.float16 else 1e-2
    torch.testing.assert_close(losses, ref_losses, rtol=tol, atol=tol)
    torch.testing.assert_close(out, ref_out, rtol=tol, atol=tol)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), base.parameters()))  # it trained
    assert losses[-2:].mean() < losses[:2].mean()


@pytest.mark.parametrize("dtype", LOW)
def test_half_inference_model_fed_float32_returns_float32(dtype):
    base = ConvNet().eval()
    x, y = make_data(6)
    out, loss = poptorch.inferenceModel(copy.deepcopy(base).to(dtype), options())(x, y)
    assert out.dtype == torch.float32 and loss.dtype == torch.float32
    with torch.no_grad():
        expected = functional_call(base, {n: p.to(dtype).float() for n, p in base.named_parameters()}, (x, y))[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def _mixed_cases(low):
    g = torch.Generator().manual_seed(0)
    x, w, b, seq, kernel, bias = (torch.randn(*shape, generator=g) for shape in
                                  [(3, 8), (5, 8), (5,), (2, 4, 8), (3, 4, 3), (3,)])

    def up(t):
        return t.to(low).float()

    return [
        # (name, an op with mixed operands, the same op on upcast operands, the result's dtype)
        ("linear", lambda: F.linear(x, w.to(low), b), lambda: F.linear(x, up(w), b), torch.float32),
        ("matmul", lambda: x.to(low) @ w.t(), lambda: up(x) @ w.t(), torch.float32),
        ("bmm", lambda: torch.bmm(seq, seq.to(low).transpose(1, 2)),
         lambda: torch.bmm(seq, up(seq).transpose(1, 2)), torch.float32),
        ("conv1d", lambda: F.conv1d(seq.to(low), kernel, bias.to(low)),
         lambda: F.conv1d(up(seq), kernel, up(bias)), torch.float32),
        ("attention", lambda: F.scaled_dot_product_attention(seq, seq.to(low), seq.to(low)),
         lambda: F.scaled_dot_product_attention(seq, up(seq), up(seq)), torch.float32),
        ("einsum", lambda: torch.einsum("bij,kj->bik", seq, w.to(low)),
         lambda: torch.einsum("bij,kj->bik", seq, up(w)), torch.float32),
        # PyTorch accepts these mixes: its result stands.
        ("add", lambda: x + x.to(low), lambda: x + up(x), torch.float32),
        ("layer_norm", lambda: F.layer_norm(x.to(low), (8,), x[0], x[1]),
         lambda: F.layer_norm(x.to(low), (8,), x[0], x[1]), low),
    ]


@pytest.mark.parametrize("low", LOW)
def test_mixed_operands_compute_in_float32(low):
    for name, mixed, upcast, dtype in _mixed_cases(low):
        with LowPrecisionOps(HalfComputePolicy("native")):
            result = mixed()
        assert result.dtype == dtype, name
        torch.testing.assert_close(result, upcast(), rtol=1e-5, atol=1e-5, msg=name)


def test_mixed_operands_keep_real_errors_and_write_in_place_in_the_destination_dtype():
    w = torch.randn(5, 8).half()
    with LowPrecisionOps(HalfComputePolicy("native")):
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            F.linear(torch.randn(3, 7), w)  # a shape error stays a shape error
        buffer = torch.zeros(3, 8, dtype=torch.float16)
        buffer[torch.tensor([1])] = torch.full((1, 8), 1.5)  # float32 values into a half buffer
        buffer.lerp_(torch.ones(3, 8), 0.5)
    assert buffer.dtype == torch.float16
    assert torch.equal(buffer[1], torch.full((8,), 1.25, dtype=torch.float16))
    assert torch.equal(buffer[0], torch.full((8,), 0.5, dtype=torch.float16))


# ------------------------------------------------------------------ half compute policy
def _family_cases(low):
    g = torch.Generator().manual_seed(0)
    seq, w, kernel = (torch.randn(*shape, generator=g).to(low) for shape in [(2, 4, 8), (5, 8), (4, 3, 3)])
    modules = [torch.nn.LSTM(8, 4, batch_first=True), torch.nn.MultiheadAttention(8, 2, batch_first=True),
               torch.nn.ConvTranspose1d(4, 3, 3)]
    low_modules = [copy.deepcopy(m).to(low) for m in modules]
    lstm, attention, deconv = low_modules
    return [
        # (name, op on half operands, the same op in float32 on the upcast operands)
        ("linear", lambda t: F.linear(t(seq), t(w))),
        ("matmul", lambda t: t(seq) @ t(w).t()),
        ("einsum", lambda t: torch.einsum("bij,kj->bik", t(seq), t(w))),
        ("conv1d", lambda t: F.conv1d(t(seq), t(kernel).transpose(0, 1))),
        ("attention", lambda t: F.scaled_dot_product_attention(t(seq), t(seq), t(seq))),
        ("lstm", lambda t: (lstm if t is _same else copy.deepcopy(lstm).float())(t(seq))[0]),
        ("multi-head attention", lambda t: (attention if t is _same else copy.deepcopy(attention).float())(
            t(seq), t(seq), t(seq))[0]),
        ("conv_transpose1d", lambda t: (deconv if t is _same else copy.deepcopy(deconv).float())(t(seq)[:, :, :4])),
    ]


def _same(tensor):
    return tensor


def _upcast(tensor):
    return tensor.float()


@pytest.mark.parametrize("low", LOW)
def test_float32_policy_computes_every_matmul_family_op_in_float32(low):
    """Op by op: under the float32 policy a matmul/convolution/attention/RNN op on half operands
    returns exactly the float32 computation rounded to the half dtype, and no half kernel runs."""
    for name, op in _family_cases(low):
        with torch.no_grad():
            with KernelDtypes() as kernels, LowPrecisionOps(HalfComputePolicy("float32")):
                result = op(_same)
            expected = op(_upcast).to(low)
        assert result.dtype == low, name
        assert torch.equal(result, expected), name
        assert kernels.dtypes() == {torch.float32}, name


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("setting", ["native", "float32"])
def test_policy_picks_the_kernels_of_a_half_model(dtype, setting, half_compute_setting):
    """Under ``float32`` every matmul/convolution kernel - forward and backward - runs on float32
    operands and the model still sees its dtype; under ``native`` they run in the half dtype.
    Both train like the float32 model within half precision."""
    half_compute_setting(setting)
    base = ConvNet()
    model, reference = copy.deepcopy(base).to(dtype), copy.deepcopy(base)
    x, y = make_data(3 * 8)
    pop = poptorch.trainingModel(model, options(di=3), poptorch.optim.SGD(model.parameters(), lr=0.05))
    pop.compile(x.to(dtype), y)
    with KernelDtypes() as kernels:
        out, losses = pop(x.to(dtype), y)
    assert out.dtype == dtype and losses.dtype == dtype
    assert kernels.dtypes() == ({torch.float32} if setting == "float32" else {dtype})
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    _ref_out, ref_losses = _upcasting_loop(reference, opt, x, y, 3, 1)
    tol = 2e-2 if dtype == torch.float16 else 8e-2
    torch.testing.assert_close(losses.float(), ref_losses, rtol=tol, atol=tol)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.float(), q, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", LOW)
def test_float32_compute_is_float32_partials_rounded_to_half(dtype, half_compute_setting):
    """The float32 path computes what an IPU computes with float32 partials: half operands,
    float32 arithmetic, one rounding of the result."""
    half_compute_setting("float32")
    model = ConvNet().to(dtype).eval()
    x, y = make_data(6)
    out, _ = poptorch.inferenceModel(model, options())(x.to(dtype), y)
    with torch.no_grad():
        h = F.relu(F.linear(x.to(dtype).float(), model.fc1.weight.float(), model.fc1.bias.float()).to(dtype))
        h = F.conv1d(h[:, None].float(), model.conv.weight.float(), model.conv.bias.float(), padding=1)
        h = h.to(dtype).flatten(1)
        h = torch.bmm(h[:, :, None].float(), h[:, None, :].float()).to(dtype).mean(-1) + h
        expected = F.linear(model.norm(h).float(), model.fc2.weight.float(), model.fc2.bias.float()).to(dtype)
    assert torch.equal(out, expected)


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.head = torch.nn.Linear(32, 50)

    def forward(self, tokens, labels):
        logits = self.head(self.layer(self.embed(tokens)))
        return logits, F.cross_entropy(logits.reshape(-1, 50), labels.reshape(-1))


def test_autocast_with_a_slow_dtype_keeps_autocast_dtypes_and_computes_in_float32(half_compute_setting):
    """Under ``Precision.autocast(True, torch.bfloat16)`` the float32 policy computes the ops
    autocast lowers from bf16-rounded operands in float32 and returns bf16, as autocast does."""
    torch.manual_seed(0)
    base = Encoder()
    tokens, labels = torch.randint(0, 50, (2 * 4, 8)), torch.randint(0, 50, (2 * 4, 8))
    results = {}
    for setting in ("native", "float32"):
        half_compute_setting(setting)
        model = copy.deepcopy(base)
        opts = options(di=2)
        opts.Precision.autocast(True, torch.bfloat16)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1))
        pop.compile(tokens, labels)
        with KernelDtypes() as kernels:
            logits, losses = pop(tokens, labels)
        results[setting] = model, logits, losses, kernels.dtypes()
    native, emulated = results["native"], results["float32"]
    assert emulated[1].dtype == native[1].dtype == torch.bfloat16  # the head's output, as autocast gives it
    assert emulated[2].dtype == native[2].dtype == torch.float32   # cross_entropy runs in float32
    assert native[3] == {torch.bfloat16} and emulated[3] == {torch.float32}
    torch.testing.assert_close(emulated[2], native[2], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(emulated[1].float(), native[1].float(), rtol=5e-2, atol=5e-2)
    for p, q in zip(emulated[0].parameters(), native[0].parameters()):
        torch.testing.assert_close(p, q, rtol=2e-2, atol=2e-2)


class TwoStages(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = poptorch.BeginBlock(torch.nn.Linear(16, 32), ipu_id=0)
        self.fc2 = poptorch.BeginBlock(torch.nn.Linear(32, 4), ipu_id=1)

    def forward(self, x, y):
        out = self.fc2(F.relu(self.fc1(x)))
        return out, F.cross_entropy(out, y)


@pytest.mark.parametrize("feed", ["half", "float32"])
def test_recomputed_blocks_follow_the_same_rules(feed, half_compute_setting):
    """Pipelined training recomputes each block in backward, after the forward's precision mode
    has exited: the recomputation must resolve half operands exactly as the forward did."""
    half_compute_setting("float32")
    base = TwoStages().half()
    x, y = make_data(2 * 3 * 4)
    if feed == "half":
        x = x.half()
    results = []
    for recompute in (True, False):
        model = copy.deepcopy(base)
        opts = options(di=2, ga=3)
        opts.setExecutionStrategy(poptorch.PipelinedExecution())
        if not recompute:
            opts._Popart.set("autoRecomputation", 0)
        pop = poptorch.trainingModel(model, opts, poptorch.optim.SGD(model.parameters(), lr=0.05))
        pop.compile(x, y)
        with KernelDtypes() as kernels:
            _, losses = pop(x, y)
        assert kernels.dtypes() == {torch.float32}
        results.append((model, losses))
    (recomputed, losses_a), (kept, losses_b) = results
    assert torch.equal(losses_a, losses_b)
    for p, q in zip(recomputed.parameters(), kept.parameters()):
        assert torch.equal(p, q)


def test_policy_decides_per_device_dtype_and_family_from_one_measurement():
    calls = []
    rates = {(torch.float16, MATMUL): (3.0, 50.0), (torch.float16, CONVOLUTION): (60.0, 50.0),
             (torch.bfloat16, MATMUL): (100.0, 50.0), (torch.bfloat16, CONVOLUTION): (1.0, 20.0)}

    def measure(dtype, family):
        calls.append((dtype, family))
        return rates[(dtype, family)]

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        speeds = CpuHalfSpeeds(measure)
        policy = HalfComputePolicy("auto", speeds)
        assert not calls  # nothing measured until a CPU decision is needed
        assert policy.native("cuda", torch.float16, MATMUL) and not calls  # CUDA: always native
        assert not policy.native("cpu", torch.float16, MATMUL)
        assert policy.native("cpu", torch.float16, CONVOLUTION)
        assert policy.native("cpu", torch.bfloat16, MATMUL)
        assert not policy.native("cpu", torch.bfloat16, CONVOLUTION)
        assert not HalfComputePolicy("auto", speeds).all_native("cpu", torch.bfloat16)
        assert HalfComputePolicy("native", speeds).native("cpu", torch.bfloat16, CONVOLUTION)
        assert not HalfComputePolicy("float32", speeds).native("cpu", torch.bfloat16, MATMUL)
        assert HalfComputePolicy("float32", speeds).native("cuda", torch.bfloat16, MATMUL)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert sorted(calls, key=str) == sorted(rates, key=str)  # each measured once
    measured = [r.getMessage() for r in records if "GFLOP/s" in r.getMessage()]
    assert len(measured) == 1
    assert "float16: matmul 3.0 vs float32 50.0 GFLOP/s -> float32 compute" in measured[0]
    assert "bfloat16: matmul 100.0 vs float32 50.0 GFLOP/s -> native" in measured[0]


def test_measured_rates_are_real_and_leave_the_rng_alone():
    state = torch.get_rng_state()
    threads = torch.get_num_threads()
    for dtype in LOW:
        for family in (MATMUL, CONVOLUTION):
            half, full = measure_cpu_rates(dtype, family)
            assert math.isfinite(half) and math.isfinite(full) and half > 0 and full > 0
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.get_num_threads() == threads


def test_rates_are_measured_on_real_tensors_even_when_first_needed_inside_a_fake_trace():
    """The executable cache's shapes-only trace runs the model on fake tensors; the first forward's
    precision check measured there timed ops that do nothing (bfloat16 479 vs float32 482 GFLOP/s
    on one core of an AMX CPU), so the choice was a coin toss and changed from process to process."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    seen = []

    def measure(dtype, family):
        seen.append(isinstance(torch.randn(4), FakeTensor))
        return 2.0, 1.0
    with FakeTensorMode():
        assert isinstance(torch.randn(4), FakeTensor)
        assert CpuHalfSpeeds(measure).half_is_fast(torch.bfloat16, MATMUL)
    assert seen and not any(seen)


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return {flag for line in cpuinfo if line.startswith("flags") for flag in line.split(":")[1].split()}
    except OSError:
        return set()


@pytest.mark.skipif("amx_bf16" not in _cpu_flags(), reason="needs a CPU with AMX (bfloat16 matmuls ~7x float32)")
def test_amx_cpus_compute_bfloat16_matmuls_natively():
    """Measured on a size where oneDNN's setup does not hide AMX (a 128 x 128 matmul measured
    bfloat16 at 0.8-0.95x float32 there: float32 compute, BERT's bf16 steps 2x slower)."""
    half, full = measure_cpu_rates(torch.bfloat16, MATMUL)
    assert half >= 2 * full, (half, full)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():  # (where the executable cache's trace first asks)
        assert CpuHalfSpeeds().half_is_fast(torch.bfloat16, MATMUL)


def test_bad_setting_is_rejected_when_the_model_is_wrapped(half_compute_setting):
    half_compute_setting("fast")
    model = ConvNet().half()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="OPENPOP_HALF_COMPUTE='fast' is not valid: set it to auto, native or float32"):
        poptorch.trainingModel(model, options(), poptorch.optim.SGD(model.parameters(), lr=0.1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_low_precision_is_faster_follows_the_setting(half_compute_setting):
    half_compute_setting("native")
    assert low_precision_is_faster(torch.bfloat16, "cpu")
    half_compute_setting("float32")
    assert not low_precision_is_faster(torch.bfloat16, "cpu")
    assert low_precision_is_faster(torch.bfloat16, "cuda")


@pytest.mark.parametrize("setting, autocast", [("native", True), ("float32", False)])
def test_bert_auto_precision_is_bf16_only_where_it_is_faster(setting, autocast, half_compute_setting):
    from openpop.bert.config import parse_args
    from openpop.bert.train import get_options
    half_compute_setting(setting)
    for name in ("cpu_base_128", "pretrain_base_128"):
        config = parse_args(["--config", name])
        assert config.precision == "auto"
        assert get_options(config).Precision.autocast_enabled is autocast
    forced = get_options(parse_args(["--config", "cpu_base_128", "--precision", "bf16"])).Precision
    assert forced.autocast_enabled and forced.autocast_dtype == torch.bfloat16


def test_lightning_mixed_precision_uses_the_policy(half_compute_setting):
    pytest.importorskip("lightning")
    from openpop.lightning.precision import IPUPrecision
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    for setting, kernel_dtype in (("native", torch.bfloat16), ("float32", torch.float32)):
        half_compute_setting(setting)
        with IPUPrecision("bf16-mixed").forward_context(), KernelDtypes() as kernels:
            out = layer(x)
        assert out.dtype == torch.bfloat16 and kernels.dtypes() == {kernel_dtype}
