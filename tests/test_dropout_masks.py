"""Compiled regions' dropout masks (runtime/compiled/dropout_masks.py): the vectorised kernel draws
aten's serial Bernoulli stream (checked against Python's own MT19937), the probe installs it only
where aten draws that stream, and the graph pass keeps masks, outputs and the generator's end state
equal to eager's."""
import random

import pytest
import torch
import torch.nn.functional as F

from openpop.runtime.compiled import dropout_masks
from openpop.runtime.compiled.dropout_masks import FastDropoutMasks, draw_mask, draws_like_aten
from openpop.runtime.compiled.regions import compile_options

from helpers.graph_passes import recorded


def reference_mask(generator, elements, p):
    """aten's serial kernel in Python: MT19937 from the generator's state (CPUGeneratorImpl's
    layout), per element the high then the low word, 53 bits as a double in [0, 1), below p."""
    state = generator.get_state()
    left = int(state[8:12].view(torch.int32))
    following = int(state[16:24].view(torch.int64))
    words = tuple(int(w) for w in state[24:24 + 624 * 8].view(torch.int64))
    twister = random.Random()
    twister.setstate((3, words + (624 if left == 1 else following,), None))
    drawn = []
    for _ in range(elements):
        high, low = twister.getrandbits(32), twister.getrandbits(32)
        drawn.append(((high & 0x1FFFFF) << 32 | low) * 2.0 ** -53 < p)
    return torch.tensor(drawn, dtype=torch.bool), twister.getstate()[1]


@pytest.mark.parametrize("elements, before, p", [
    (0, 5, 0.5), (1, 0, 0.5), (2, 623, 0.9), (311, 1, 0.1), (312, 0, 0.0), (313, 2, 1.0), (5000, 77, 0.3),
])
def test_kernel_draws_the_serial_mersenne_twister_stream(elements, before, p):
    generator = torch.Generator().manual_seed(elements + before)
    torch.rand(before, generator=generator)  # one 32-bit word per float: any position in a block
    expected, end = reference_mask(generator, elements, p)
    drawn = draw_mask(torch.empty(elements, dtype=torch.bool), p, generator)
    assert torch.equal(drawn, expected)
    state = generator.get_state()
    if elements:  # the generator continues where the reference's twister is
        words = tuple(int(w) for w in state[24:24 + 624 * 8].view(torch.int64))
        assert words + (int(state[16:24].view(torch.int64)),) == end
    torch.rand(3, generator=generator)  # and the state written back is one torch accepts


def test_probe_follows_aten_and_refuses_a_different_stream(monkeypatch):
    generator = torch.Generator().manual_seed(3)
    expected, _ = reference_mask(generator, 2000, 0.9)
    serial = torch.equal(torch.empty(2000, dtype=torch.bool).bernoulli_(0.9, generator=generator), expected)
    assert draws_like_aten() == serial  # (Intel CPUs: aten's MKL path, another stream)
    assert (FastDropoutMasks in post_grad_passes(training=True)) == serial
    assert FastDropoutMasks not in post_grad_passes(training=False)  # (no dropout in inference)

    def wrong(state, out, elements, p):
        torch.zeros(elements, dtype=torch.uint8).numpy()  # (does not fill ``out``)

    monkeypatch.setattr(dropout_masks, "_kernel", lambda: wrong)
    draws_like_aten.cache_clear()
    try:
        assert not draws_like_aten()
    finally:
        draws_like_aten.cache_clear()


def post_grad_passes(training):
    passes = compile_options(torch.device("cpu"), training).get("post_grad_custom_post_pass")
    return [type(p) for p in passes] if passes is not None else []


class TwoDropouts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.b(F.dropout(torch.tanh(self.a(x)), 0.25, self.training)) + F.dropout(x[:, :8], 0.5, self.training)


@pytest.mark.skipif(not draws_like_aten(), reason="aten does not draw the serial stream on this CPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pass_keeps_eager_masks_outputs_gradients_and_generator(monkeypatch, dtype):
    torch._dynamo.reset()
    graphs = []

    drawn = []
    monkeypatch.setattr(dropout_masks, "draw_mask", lambda m, p, g, draw=draw_mask: drawn.append(p) or draw(m, p, g))
    torch.manual_seed(0)
    model = TwoDropouts()
    options = {"fallback_random": True, "post_grad_custom_post_pass": recorded(FastDropoutMasks, graphs)}
    with_pass = torch.compile(model.forward, options=options)
    with_aten = torch.compile(model.forward, options={"fallback_random": True})  # aten's native_dropout
    x = torch.randn(16, 32)
    results = []
    for run in (with_pass, with_aten, model.forward):
        torch.manual_seed(7)
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            out = run(x)
        out.float().square().sum().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()], torch.random.get_rng_state()))
    (out, grads, state), (aten_out, aten_grads, _), (eager_out, eager_grads, eager_state) = results
    assert drawn == [0.75, 0.5]  # both dropouts drawn by the kernel, in order
    assert torch.equal(state, eager_state)
    assert torch.equal(out == 0, eager_out == 0)
    if dtype == torch.float32:  # x * mask * scale rounds once either way
        torch.testing.assert_close(out, aten_out, rtol=0, atol=0)
        torch.testing.assert_close(out, eager_out)
        for ours, with_aten, theirs in zip(grads, aten_grads, eager_grads):
            torch.testing.assert_close(ours, with_aten, rtol=0, atol=0)
            torch.testing.assert_close(ours, theirs)
    else:  # bfloat16: no further from eager than with aten's kernel (Inductor's fusions round less)
        for ours, with_aten, theirs in zip([out] + grads, [aten_out] + aten_grads, [eager_out] + eager_grads):
            assert (ours - theirs).abs().max() <= 2 * (with_aten - theirs).abs().max() + 1e-2 * theirs.abs().max()
    forward = graphs[0]  # (Inductor wraps the second draw in control_deps, after the first)
    assert not forward.find_nodes(op="call_function", target=torch.ops.aten.native_dropout.default)


@pytest.mark.skipif(not draws_like_aten(), reason="aten does not draw the serial stream on this CPU")
@pytest.mark.parametrize("dtype, transposed", [(torch.float32, False), (torch.bfloat16, False),
                                               (torch.float16, False), (torch.float64, False), (torch.float32, True)])
def test_dropout_alone_equals_eager_bit_for_bit(dtype, transposed):
    torch._dynamo.reset()
    x = torch.randn(64, 48).to(dtype)
    x = x.t() if transposed else x  # (aten's mask is laid out as the input and drawn in memory order)
    dropout = torch.compile(lambda t: F.dropout(t, 0.1, True),
                            options={"fallback_random": True, "post_grad_custom_post_pass": FastDropoutMasks()})
    outputs = []
    for run in (dropout, lambda t: F.dropout(t, 0.1, True)):
        torch.manual_seed(11)
        outputs.append((run(x), torch.random.get_rng_state()))
    (out, state), (eager, eager_state) = outputs
    assert torch.equal(out, eager) and torch.equal(state, eager_state)  # (half: the scale rounded as aten's)


def test_a_generator_state_of_another_layout_is_refused_before_the_kernel_writes():
    class Shorter:
        def get_state(self):
            return torch.zeros(100, dtype=torch.uint8)

    with pytest.raises(RuntimeError, match="a CPU generator state of 100 bytes, not at least 5016"):
        draw_mask(torch.empty(4, dtype=torch.bool), 0.5, Shorter())
