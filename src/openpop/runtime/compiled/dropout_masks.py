"""Dropout masks of compiled regions drawn ten times faster, bit for bit as aten draws them.

Compiled regions keep aten's random ops (``fallback_random``) so that dropout masks equal eager's;
AOTAutograd traces ``F.dropout`` to ``aten.native_dropout``, which Inductor then calls as an opaque
kernel. On CPUs where aten's ``bernoulli_(p)`` is its serial kernel (AMD EPYC here; Intel CPUs
take an MKL path instead) that kernel draws one Mersenne Twister double per element: ~4 ns per
element, ~0.3 s of a BERT-base step (micro-batch 8 x 2) - 5 % of fp32's and 15 % of bf16's.

``bernoulli_mask`` is the same draw written over whole blocks of the twister's state, which the
compiler vectorises (``_SOURCE``; ~0.4 ns per element on AVX-512): MT19937 as ``at::mt19937``, two
32-bit outputs per element (the high word first), their low 53 bits as a double in [0, 1), true
where it is below ``p``. It reads torch's default CPU generator with ``get_state()`` and writes
it back with ``set_state()``, so the stream continues exactly as after aten's kernel.

``FastDropoutMasks`` is an Inductor post-grad pass (``post_grad_custom_post_pass`` of CPU training
regions, ``regions.compile_options``): each CPU ``native_dropout`` in training becomes
``bernoulli_mask`` and ``input * mask * scale``, which Inductor fuses with its neighbours. It is
installed only where ``draws_like_aten()`` found, on this machine, that the kernel's masks and
the generator's end state equal aten's ``bernoulli_``; elsewhere aten's kernel stays. The op is
tagged ``nondeterministic_seeded``, so Inductor never merges two draws and orders them by control
dependencies: the draws keep the graph's order. (The mask is saved for backward because
``native_dropout``'s mask already is a forward output when the pass runs.) Reading and writing the
generator's state is not atomic, as aten's kernel under the generator's lock is: another thread
drawing from torch's default CPU generator during a mask's draw would draw the same numbers
(openpop runs regions on one thread).
The whole-call program (``program.py``) keeps aten's kernel: it is for small models, and its loop
bodies run under Inductor's C++ wrapper.
"""
import ctypes
import functools
import logging
import operator

import torch

from .. import messages
from .graph_pass import SourceKeyedPass

logger = logging.getLogger(__name__)

_SOURCE = r"""
#include <stdint.h>

namespace {
constexpr int N = 624, M = 397;
constexpr uint32_t UPPER = 0x80000000u, LOWER = 0x7fffffffu, MATRIX_A = 0x9908b0dfu;

inline uint32_t twist(uint32_t u, uint32_t v) {
  return (((u & UPPER) | (v & LOWER)) >> 1) ^ ((0u - (v & 1u)) & MATRIX_A);
}

void regenerate(uint32_t* s) {
  for (int i = 0; i < N - M; i++) s[i] = s[i + M] ^ twist(s[i], s[i + 1]);
  for (int i = N - M; i < N - 1; i++) s[i] = s[i + M - N] ^ twist(s[i], s[i + 1]);
  s[N - 1] = s[M - 1] ^ twist(s[N - 1], s[0]);
}

inline uint32_t temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
}

// The head of CPUGeneratorImpl::get_state()'s bytes (THGeneratorState).
struct GeneratorState {
  uint64_t seed;
  int32_t left;  // 1: the next output regenerates the state first
  int32_t seeded;
  uint64_t next;
  uint64_t words[N];
};
}  // namespace

extern "C" void openpop_bernoulli_mask(void* state, uint8_t* out, int64_t n, double p) {
  GeneratorState* g = (GeneratorState*)state;
  uint32_t s[N], t[N + 1];  // t: tempered outputs; t[0] may carry a pair's high word over a block end
  for (int i = 0; i < N; i++) s[i] = (uint32_t)g->words[i];
  int pos = g->left == 1 ? N : (int)g->next, carried = 0;
  const double limit = p * 9007199254740992.0;  // u < p  <=>  u * 2^53 < p * 2^53 (exact)
  for (int64_t done = 0; done < n;) {
    if (pos == N) {
      regenerate(s);
      pos = 0;
    }
    int64_t wanted = 2 * (n - done) - carried;
    int take = (int)(N - pos < wanted ? N - pos : wanted);
    for (int i = 0; i < take; i++) t[carried + i] = temper(s[pos + i]);
    pos += take;
    int words = carried + take, pairs = words / 2;
    uint8_t* o = out + done;
    for (int k = 0; k < pairs; k++) {
      uint64_t v = ((uint64_t)(t[2 * k] & 0x1fffffu) << 32) | t[2 * k + 1];
      o[k] = (double)v < limit;
    }
    done += pairs;
    carried = words & 1;
    if (carried) t[0] = t[words - 1];
  }
  if (n > 0) {
    for (int i = 0; i < N; i++) g->words[i] = s[i];
    g->next = (uint64_t)pos;
    g->left = N + 1 - pos;
  }
}
"""


_STATE_BYTES = 24 + 624 * 8  # (GeneratorState in _SOURCE)


@functools.cache
def _kernel():
    """The compiled ``openpop_bernoulli_mask``, built and cached by Inductor's C++ code cache
    (with loop vectorisation, which Inductor's own flags turn off)."""
    from ...torch_compat import CppCodeCache
    library = CppCodeCache.load(_SOURCE, needs_vec_isa=True, extra_flags=("-ftree-loop-vectorize",))
    function = library.openpop_bernoulli_mask
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
    function.restype = None
    return function


def draw_mask(mask: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Fill the boolean, dense ``mask`` in memory order with Bernoulli(``p``) draws from the CPU
    ``generator``, advancing it as aten's serial ``bernoulli_`` does."""
    state = generator.get_state()
    if state.numel() < _STATE_BYTES:  # (another layout than the kernel's: not written past its end)
        raise RuntimeError(messages.GENERATOR_STATE_BYTES.format(size=state.numel(), expected=_STATE_BYTES))
    _kernel()(state.data_ptr(), mask.data_ptr(), mask.numel(), p)
    generator.set_state(state)
    return mask


@torch.library.custom_op("openpop::bernoulli_mask", mutates_args=(), device_types="cpu",
                         tags=(torch.Tag.nondeterministic_seeded,))
def bernoulli_mask(like: torch.Tensor, p: float) -> torch.Tensor:
    """A boolean tensor laid out as ``like`` (``empty_like``), true with probability ``p``, drawn
    from torch's default CPU generator."""
    return draw_mask(torch.empty_like(like, dtype=torch.bool), p, torch.default_generator)


@bernoulli_mask.register_fake
def _(like, p):
    return torch.empty_like(like, dtype=torch.bool)


# (elements, outputs drawn before, p): odd counts and offsets cross the twister's 624-word blocks
_PROBES = ((1, 0, 0.5), (7, 3, 0.9), (625, 624, 0.1), (1250, 1, 0.9), (20000, 77, 0.3))


@functools.cache
def draws_like_aten() -> bool:
    """Whether ``bernoulli_mask`` equals aten's ``bernoulli_`` on this machine: masks and the
    generator's state after them (aten's serial kernel; not its MKL path)."""
    from ...torch_compat import disable_current_modes
    try:
        with disable_current_modes(), torch.inference_mode(False):  # (called while Dynamo traces)
            for elements, before, p in _PROBES:
                theirs = torch.Generator().manual_seed(elements)
                torch.rand(before, generator=theirs)
                ours = torch.Generator()
                ours.set_state(theirs.get_state())
                expected = torch.empty(elements, dtype=torch.bool).bernoulli_(p, generator=theirs)
                drawn = draw_mask(torch.empty(elements, dtype=torch.bool), p, ours)
                if not torch.equal(drawn, expected) or not torch.equal(ours.get_state(), theirs.get_state()):
                    logger.debug("aten's bernoulli_ is not the serial MT19937 kernel here: dropout keeps it")
                    return False
    except Exception as error:  # (no C++ compiler, a generator state of another layout)
        logger.debug("the fast dropout mask is not available: %s", error)
        return False
    return True


def _rewrite(graph: torch.fx.Graph) -> None:
    for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.native_dropout.default)):
        x, p, train = (list(node.args) + [node.kwargs.get("train")])[:3]
        value = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if train is False or not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            continue
        if not isinstance(p, float) or not 0.0 <= p <= 1.0:
            continue  # (aten's kernel checks p)
        if any(user.op != "call_function" or user.target is not operator.getitem for user in node.users):
            continue  # used whole (not expected from AOTAutograd): aten's kernel stays
        kept = 1.0 - p
        scale = 0.0 if kept == 0 else 1.0 / kept
        if value.dtype in (torch.bfloat16, torch.float16):  # aten multiplies by the scale rounded to them
            scale = float(torch.tensor(scale, dtype=value.dtype))
        with graph.inserting_before(node), value.fake_mode:
            mask = graph.call_function(torch.ops.openpop.bernoulli_mask.default, (x, kept))
            mask.meta["val"] = torch.ops.openpop.bernoulli_mask.default(value, kept)
            masked = graph.call_function(torch.ops.aten.mul.Tensor, (x, mask))
            masked.meta["val"] = value * mask.meta["val"]
            out = graph.call_function(torch.ops.aten.mul.Tensor, (masked, scale))
            out.meta["val"] = masked.meta["val"] * scale
        for user in list(node.users):
            user.replace_all_uses_with(out if user.args[1] == 0 else mask)
            graph.erase_node(user)
        graph.erase_node(node)


class FastDropoutMasks(SourceKeyedPass):
    """Inductor post-grad pass: CPU ``native_dropout`` in training as ``bernoulli_mask`` times the
    input and the scale (module docstring). Its ``uuid`` (this file's hash) enters the keys of
    torch's compile caches."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        _rewrite(graph)
