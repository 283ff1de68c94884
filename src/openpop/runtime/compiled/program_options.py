"""What ``torch.compile`` is given for a program: the forward's contexts and Inductor's options
(``compile_kwargs``: the C++ wrapper, cacheable loops, random numbers, half-precision rounding)."""
import torch

from .attention_backward import ShortAttentionBackward
from .cuda_graphs import compile_options
from .half_saturation_pass import SaturateHalf

_WHILE_LOOP = "torch.ops.higher_order.while_loop"  # the name torch's caches know it by
SMALL_PROGRAM_OPS = 32  # (the tiny MLP of benchmarks/host_overhead.py: 13; one BERT layer: 122)


def forward_contexts(call):
    """``(factories, stepwise)``: the contexts the traced forward enters (the run's precision, and
    Lightning's through the model's ``compiled_forward_contexts``), and whether one is a torch
    function mode, which makes the program stepwise (``program.py``)."""
    contexts, stepwise = call.precision.traced_forward(call.model)
    own_contexts = getattr(call.model, "compiled_forward_contexts", None)  # Lightning's precision
    if own_contexts is not None:
        factories, function_mode = own_contexts()
        contexts, stepwise = contexts + list(factories), stepwise or function_mode
    return contexts, stepwise


def compile_kwargs(device, geometry, draws_random, half_casts=False, loops=True, ops=None, training=False,
                   saturate_half=False):
    """``torch.compile``'s arguments for a program on ``device``. CUDA: CUDA graphs
    (``cuda_graphs.py``). CPU, a program that loops over device iterations, or a small one (at
    most ``SMALL_PROGRAM_OPS`` aten ops per micro-batch, ``ops`` as the probe counted them):
    Inductor's C++ wrapper. Its default Python wrapper runs ``while_loop`` as a Python loop calling each
    iteration's kernels from Python (argument asserts, buffer allocations, ATen matmul calls: ~20 µs
    per step of the tiny MLP); the C++ wrapper runs the same loop in C++ (benchmarks/host_overhead.py:
    DI=256 34 -> 12 µs per step). A one-step program keeps the Python wrapper, also when it loops
    over micro-batches, unless it is small: the C++ wrapper saves ~35 µs per micro-batch of the tiny
    MLP (DI=1 GA=4: 473 -> 331 µs per step) and ~10 µs per host call of its one-step program (whose
    cold compile it leaves at 19 CPU-s), but its own C++ build is large for a large graph (BERT L2 GA
    2: first compile 64 -> 156 CPU-s), whose steps take milliseconds; stepwise programs
    (``loops=False``) keep it too. A program with a
    ``while_loop`` (``loops`` and DI or GA x R > 1) marks it cacheable: torch's FX-graph and
    AOTAutograd caches refuse higher-order ops not marked so, and the loop bodies are part of the
    graph their keys hash (checked: a program differing only in a body misses). A model that draws random
    numbers: aten's random ops, drawing from torch's generators at run time as eager does
    (``program.py``); only then, as it changes Inductor's decompositions. ``half_casts`` (programs
    holding float16/bfloat16 tensors): every half intermediate rounded as eager rounds it
    (Inductor otherwise keeps fused element-wise chains in float32: half gradients summed over
    micro-batches, half weights updated would differ from eager's by an ulp; stochastic rounding
    would see its float32 value as already rounded). A CPU training program:
    short attention's backward as tensor math (``attention_backward.py``). ``saturate_half`` (a
    model computing in float16, ``half_saturation.applies``): float16 results clamped to +-65504, as
    eager clamps them (``half_saturation_pass.py``)."""
    options = dict(compile_options(device))
    small = ops is not None and ops <= SMALL_PROGRAM_OPS
    if not options and loops and (geometry.device_iterations > 1 or small):
        options["cpp_wrapper"] = True
        # The wrapper (the loop driving the kernels) built apart from the kernels, at -O1: as one
        # -O3 unit with them, BERT tiny's DI=16 program (1 MB of C++) did not build in 56 min of
        # g++ (3.9 GB); apart, it compiles in ~5 min. Step times are unchanged (the tiny MLP's
        # DI=16 and 256 within 3 %; benchmarks/host_overhead.py's BERT rows).
        options["cpp_wrapper_build_separate"] = True
    if loops and (geometry.device_iterations > 1 or geometry.micro_batches_per_step > 1):
        options["unsafe_marked_cacheable_functions"] = {_WHILE_LOOP: torch.__version__}
    if draws_random:
        options["fallback_random"] = True
    if half_casts:
        options["emulate_precision_casts"] = True
    from .passes import active  # (the registry: each pass's switch)
    if training and device.type == "cpu" and active("attention_backward"):
        options["post_grad_custom_pre_pass"] = ShortAttentionBackward()
    if saturate_half:
        options["post_grad_custom_post_pass"] = SaturateHalf()
    return {"options": options} if options else {}
