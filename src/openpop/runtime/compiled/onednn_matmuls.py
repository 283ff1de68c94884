"""float32 matrix products of compiled CPU regions on oneDNN, where this CPU runs them faster.

aten's float32 ``mm`` and ``addmm`` call the BLAS torch was built with: MKL in the PyPI wheels.
On AMD CPUs MKL runs AVX2 code. On an AMD EPYC with AVX-512 (Zen 5, 2 cores), its sgemm gives
~110 GFLOP/s per core and oneDNN's (``mkldnn._linear_pointwise``, the kernel Inductor uses for
frozen linear layers) ~250: BERT-base's GEMM shapes ran 1.8-2.5x faster in every direction
(forward, input gradient, weight gradient), and below ~128^3 multiply-adds oneDNN's per-call cost
makes it slower. Inductor's own lowering of ``_linear_pointwise`` takes only frozen (constant)
weights, so here it is the custom op ``onednn_linear``, which Inductor calls as an opaque kernel.

``OneDnnMatmuls`` is an Inductor post-grad pass: each float32 CPU ``mm``, and ``addmm`` with a
1-D bias and unit scales, of at least ``MIN_MACS`` multiply-adds becomes ``onednn_linear``. Its
results differ from aten's by the rounding of another summation order (~1e-6 relative), as
Inductor's fusions' do. ``gemm_choice()`` decides once per process: ``OPENPOP_CPU_GEMM=auto``
(default) measures both on one GEMM and takes oneDNN where it is at least ``MIN_SPEEDUP`` times
aten's rate (one log line); ``onednn`` and ``aten`` force either (a torch without oneDNN runs
aten's, with a warning). The margin keeps a noisy measurement from choosing differently in two
processes, which would miss the executable cache's graphs; a CPU near it can still: set the
variable there. The eager backend, the reference, always runs aten's.
"""
import functools
import logging

import torch

from ... import openpop_settings
from ...torch_compat import mkldnn_linear_pointwise
from .. import messages
from ..half_compute import best_seconds, measuring
from ..machine_rates import remembered
from .graph_pass import SourceKeyedPass

logger = logging.getLogger(__name__)

SETTING_ENV = openpop_settings.env("cpu_gemm")
SETTINGS = ("auto", "onednn", "aten")
MIN_MACS = 1 << 22  # (128 x 128 x 256)
MIN_SPEEDUP = 1.25  # a margin the measurement's noise does not cross (Zen 5: ~2.2x; an AVX-512 Xeon's MKL: ~1x)
_PROBE_SHAPE = (256, 1024, 1024)  # (m, k, n): ~1 ms in aten's on 2 cores of the EPYC


@torch.library.custom_op("openpop::onednn_linear", mutates_args=(), device_types="cpu")
def onednn_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``input @ weight.T + bias`` by oneDNN (any strides of ``input`` and ``weight``; oneDNN reads
    the bias as ``weight.shape[0]`` contiguous values, so any other bias is made one)."""
    if bias is not None and (bias.shape != weight.shape[:1] or bias.stride() != (1,)):
        bias = bias.expand(weight.shape[:1]).contiguous()
    return mkldnn_linear_pointwise(input, weight, bias, "none", [], "")


@onednn_linear.register_fake
def _(input, weight, bias=None):
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


def setting_from_env() -> str:
    return openpop_settings.choice("cpu_gemm", SETTINGS, messages.CPU_GEMM_ENV)


@remembered("cpu_gemm_float32")
def measure_rates() -> tuple:
    """``(aten, onednn)`` float32 GFLOP/s on ``_PROBE_SHAPE`` (``half_compute.measuring``), measured
    once per machine (``machine_rates.py``)."""
    m, k, n = _PROBE_SHAPE
    with measuring():
        generator = torch.Generator().manual_seed(0)  # (not the user's)
        a, weight = torch.rand(m, k, generator=generator), torch.rand(n, k, generator=generator)
        products = {"aten": lambda: torch.mm(a, weight.t()), "onednn": lambda: onednn_linear(a, weight)}
        for product in products.values():
            product()  # (oneDNN creates its primitive at the first call)
        aten, onednn = (best_seconds(product, 5) for product in products.values())
    flops = 2.0 * m * k * n / 1e9
    return flops / aten, flops / onednn


@functools.cache
def gemm_choice() -> str:
    """``"onednn"`` or ``"aten"`` for this process's compiled CPU float32 GEMMs (module docstring)."""
    setting = setting_from_env()
    if not torch.backends.mkldnn.is_available():
        if setting == "onednn":
            logger.warning(messages.CPU_GEMM_NO_ONEDNN.format(env=SETTING_ENV))
        return "aten"
    if setting != "auto":
        return setting
    try:
        aten, onednn = measure_rates()
    except RuntimeError as error:  # (a oneDNN without this op)
        logger.debug("oneDNN's float32 GEMM is not available: %s", error)
        return "aten"
    choice = "onednn" if onednn >= MIN_SPEEDUP * aten else "aten"
    logger.info(messages.CPU_GEMM_CHOICE.format(aten=aten, onednn=onednn, choice=choice, env=SETTING_ENV))
    return choice


def uses_onednn() -> bool:
    """The pass registry's probe (``passes.py``): whether this process's compiled CPU float32 GEMMs
    run on oneDNN (``gemm_choice()``)."""
    return gemm_choice() == "onednn"


def _operands(node):
    """``(input, weight-side operand, bias)`` of a rewritable ``mm``/``addmm`` node, or None."""
    aten = torch.ops.aten
    if node.target is aten.mm.default and not node.kwargs:
        (a, b), bias = node.args, None
    elif node.target is aten.addmm.default and not node.kwargs and len(node.args) == 3:
        bias, a, b = node.args
    else:
        return None
    values = [getattr(t, "meta", {}).get("val") for t in (a, b) + ((bias,) if bias is not None else ())]
    if any(not isinstance(v, torch.Tensor) or v.dtype != torch.float32 or v.device.type != "cpu" for v in values):
        return None
    (m, k), n = values[0].shape, values[1].shape[1]
    if bias is not None and (tuple(values[2].shape) != (n,) or values[2].stride() != (1,)):
        return None  # (a broadcast or strided bias: aten's addmm)
    if m * k * n < MIN_MACS:
        return None
    return a, b, bias


def _rewrite(graph: torch.fx.Graph) -> None:
    for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.mm.default)) + \
            list(graph.find_nodes(op="call_function", target=torch.ops.aten.addmm.default)):
        found = _operands(node)
        if found is None:
            continue
        a, b, bias = found
        value = node.meta["val"]
        with graph.inserting_before(node), value.fake_mode:
            weight = graph.call_function(torch.ops.aten.permute.default, (b, [1, 0]))
            weight.meta["val"] = b.meta["val"].permute(1, 0)
            product = graph.call_function(torch.ops.openpop.onednn_linear.default, (a, weight, bias))
            product.meta["val"] = torch.ops.openpop.onednn_linear.default(
                a.meta["val"], weight.meta["val"], None if bias is None else bias.meta["val"])
        node.replace_all_uses_with(product)
        graph.erase_node(node)


class OneDnnMatmuls(SourceKeyedPass):
    """Inductor post-grad pass: large float32 CPU ``mm``/``addmm`` as ``onednn_linear`` (module
    docstring). Its ``uuid`` (this file's hash) enters the keys of torch's compile caches."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        _rewrite(graph)
