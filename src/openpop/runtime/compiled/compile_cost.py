"""What compiling a program will cost, guessed before compiling it: the C of ``auto``'s ski rental
(``selection.py``).

The guess is linear in the size of the graph torch.compile traces, measured by counting the aten
ops of the probe micro-batch (``eligibility.probe``: one eager forward + backward, which runs before
any compile anyway; ``auto`` runs it once, at its first host call, to get the estimate):

    seconds = FIXED_SECONDS + SECONDS_PER_OP * ops * unrolled + per-tensor seconds * trained tensors
              (+ MICRO_BATCH_LOOP_SECONDS for a loop over a step's micro-batches)

``ops`` counts the ops that compute (views excluded); ``unrolled`` is how many copies of the
micro-batch's forward and backward the program holds (one: device iterations and a step's
micro-batches are ``while_loop``s, traced once; GA x R for a stepwise program, which unrolls the
micro-batches); the trained tensors
each get a functional optimizer update, whose cost depends on the optimizer (LAMB's norms and
trust ratio: five times SGD's). The constants below come from ``benchmarks/compile_cost.py``
(the calibration table in ``benchmarks/RESULTS.md``) and are the only place to recalibrate. They are CPU seconds,
which hardly depend on the machine's load; the eager seconds they are compared with are estimated
from the probe's counts too (``eager_call_seconds``: aten ops and FLOPs per micro-batch), so a run
switches to the compiled backend at the same host call however busy the machine is.

A program already compiled - in this process, or by any process into the directory Inductor
caches it in (the executable cache, ``enableExecutableCaching``, else torch's default
``TORCHINDUCTOR_CACHE_DIR``) - is *warm*: Dynamo still traces it, but Inductor loads its kernels.
Each compiled program leaves its fingerprint (model structure, op count, geometry, optimizer,
openpop's compiled-backend code) in
``_compiled_here`` and as an empty file under ``<that directory>/openpop-programs/``; a warm
program's estimate is ``WARM_FRACTION`` of the cold one.
"""
import dataclasses
import functools
import getpass
import glob
import hashlib
import os
import re
import tempfile

import torch
from torch.utils.flop_counter import flop_registry

from ...atomic_file import atomic_write
from ...torch_compat import TorchDispatchMode
from ..shapes_only import is_metadata
from .processes import num_processes

# Calibration (benchmarks/compile_cost.py; docs/guides/compiled-backend.md "When auto compiles"):
# compile CPU seconds on this machine (about the wall seconds of an idle 2-core machine).
FIXED_SECONDS = 13.0  # Dynamo, AOTAutograd and Inductor's start, the smallest program (C++ wrapper)
SECONDS_PER_OP = 0.12  # per computing aten op (views excluded) of the traced forward + backward
SECONDS_PER_TENSOR = {"SGD": 0.075, "LAMB": 0.375}  # per trained tensor's update, by optimizer class
OTHER_OPTIMIZER_SECONDS_PER_TENSOR = 0.225  # Adam, AdamW, RMSprop: not measured, between the two
REGION_SECONDS = 2.0  # the unit "regions": per distinct compiled region beyond the first
MICRO_BATCH_LOOP_SECONDS = 3.0  # a step's micro-batches as a while_loop (MLP GA 4, BERT L2 GA 2: +3-4 s)
WARM_FRACTION = 0.15  # compiled before: Dynamo traces again, Inductor loads (measured 0.03-0.2)
# The eager side, estimated from counts (eager_call_seconds): a host-side cost per aten op
# (dispatch, hooks: 0.02-0.06 ms measured for the tests' MLPs on a 2-core EPYC) and the device's
# nominal rate (BERT-base's micro-batch of 8 x 128 ran at ~125 GFLOP/s there, 2 threads).
EAGER_SECONDS_PER_OP = 4e-5
FLOPS_PER_SECOND = {"cpu": 1e11, "cuda": 3e13}
UNPROBED_CALL_SECONDS = 0.1  # a call of a model the probe could not count

PROGRAMS_DIR = "openpop-programs"  # in the executable cache directory: one empty file per program
_compiled_here = set()  # fingerprints of the programs compiled in this process


@dataclasses.dataclass(frozen=True)
class CompileCost:
    """The estimate and what it was computed from (for the log line and the tests)."""

    ops: int  # computing aten ops of one micro-batch's forward + backward
    unrolled: int  # copies of it in the program
    tensors: int  # trained tensors (optimizer updates)
    warm: bool
    fingerprint: str
    optimizer: str = "SGD"  # the optimizer's class name
    micro_batch_loop: bool = False  # the program loops over a step's micro-batches
    regions: int = 0  # the unit "regions": distinct compiled regions (ops: their share); 0: a program

    @property
    def seconds(self) -> float:
        if self.regions:  # the optimizer runs eagerly: no per-tensor updates to compile
            cold = FIXED_SECONDS + SECONDS_PER_OP * self.ops + REGION_SECONDS * (self.regions - 1)
            return cold * WARM_FRACTION if self.warm else cold
        per_tensor = SECONDS_PER_TENSOR.get(self.optimizer, OTHER_OPTIMIZER_SECONDS_PER_TENSOR)
        cold = FIXED_SECONDS + SECONDS_PER_OP * self.ops * self.unrolled + per_tensor * self.tensors
        if self.micro_batch_loop:
            cold += MICRO_BATCH_LOOP_SECONDS
        return cold * WARM_FRACTION if self.warm else cold


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run under it (backward ops included): all, and those that compute
    (not views, which Inductor folds into the kernels around them), and the floating-point
    operations of those torch has a formula for (``torch.utils.flop_counter``: matmuls,
    convolutions, attention; elementwise ops count none)."""

    def __init__(self):
        super().__init__()
        self.all_ops = 0
        self.ops = 0
        self.flops = 0
        self.convolution_flops = 0  # those of convolutions, forward and backward (selection.compiling_pays)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_metadata(func):  # (fake tensors' queries: shapes_only.py)
            return func(*args, **kwargs)
        self.all_ops += 1
        if not func.is_view:
            self.ops += 1
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            try:
                flops = formula(*args, **kwargs, out_val=out)
            except Exception:  # a formula that does not know these arguments: the op counts none
                flops = 0
            self.flops += flops
            if "convolution" in func._overloadpacket.__name__:
                self.convolution_flops += flops
        return out


def eager_call_seconds(ops: int, flops: int, micro_batches: int, device_type: str) -> float:
    """What an eager host call of ``micro_batches`` micro-batches costs, each of ``ops`` aten ops
    doing ``flops`` between them, estimated from those counts (the ski rental's eager side: the
    same call counts the same on a busy machine as on an idle one)."""
    rate = FLOPS_PER_SECOND.get(device_type, FLOPS_PER_SECOND["cpu"])
    return micro_batches * (ops * EAGER_SECONDS_PER_OP + flops / rate)


def unrolled_micro_batches(geometry, loops=True) -> int:
    """Copies of the micro-batch forward + backward in the traced program: one when the program
    loops over a step's micro-batches (``micro_batches.py``), GA x R when it unrolls them (a
    stepwise program, ``program.py``)."""
    return 1 if loops else geometry.micro_batches_per_step


def estimate(call, ops: int, cache=None, loops=True, regions=None) -> CompileCost:
    """The compile cost of ``call``'s program, from ``ops`` counted in its probe (``loops``:
    whether the program loops over micro-batches or unrolls them); ``regions``, for the unit
    "regions": ``(share, graphs)`` from ``regions.distinct_share`` - the share of the model compiled
    as distinct code scales ``ops``, each distinct region adds ``REGION_SECONDS``."""
    model = call.model
    print_ = _fingerprint(call, ops, regions is not None)
    # (with several processes only what this process compiled counts: a marker another process is
    # writing must not make the processes choose differently, compiled/processes.py)
    warm = print_ in _compiled_here or (num_processes(call) <= 1 and os.path.exists(_marker(cache, print_)))
    if regions is not None:
        share, graphs = regions
        return CompileCost(round(ops * share), 1, 0, warm, print_, regions=graphs)
    tensors = sum(1 for p in model.parameters() if p.requires_grad) if call.training else 0
    optimizer = type(call.optimizer).__name__ if call.training else ""
    unrolled = unrolled_micro_batches(call.geometry, loops)
    loop = loops and call.geometry.micro_batches_per_step > 1
    return CompileCost(ops, unrolled, tensors, warm, print_, optimizer, loop)


def compiled(cost: CompileCost, cache=None) -> None:
    """``cost``'s program has compiled: the next estimate of it is warm."""
    _compiled_here.add(cost.fingerprint)
    marker = _marker(cache, cost.fingerprint)
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "a"):
            pass
    except OSError:  # a read-only cache only loses the hint
        pass


def _marker(cache, fingerprint):
    """The marker file in the directory Inductor caches the program in (``cache``: the executable
    cache, or None: torch's default, as ``torch._inductor.runtime.cache_dir_utils`` finds it)."""
    if cache is not None:
        directory = cache.path
    else:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
            tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    return os.path.join(directory, PROGRAMS_DIR, fingerprint)


@functools.cache
def program_source() -> str:
    """A hash of the compiled backend's own code: another openpop traces other programs, which
    Inductor's cache misses, so its markers must not make them warm."""
    digest = hashlib.sha1()
    for path in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "*.py"))):
        with open(path, "rb") as source:
            digest.update(source.read())
    return digest.hexdigest()[:12]


def remembered_unit(call, inputs, cache):
    """The unit ``auto`` chose for this model and these inputs when it compiled into the executable
    ``cache`` before (``remember_unit``), or None."""
    try:
        with open(_unit_marker(call, inputs, cache)) as marker:
            unit = marker.read().strip()
    except OSError:
        return None
    return unit if unit in ("program", "regions") else None


def remember_unit(call, inputs, cache, unit) -> None:
    marker = _unit_marker(call, inputs, cache)
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        atomic_write(marker, lambda stream: stream.write(unit.encode()))  # (processes share the cache)
    except OSError:  # a read-only cache only loses the hint
        pass


def _unit_marker(call, inputs, cache):
    """What the unit's rule saw, without running the model: its structure, the inputs' shapes,
    the geometry, the optimizer, this openpop and torch (the machine is the cache's)."""
    shapes = [(tuple(t.shape), str(t.dtype)) for t in inputs.leaves if isinstance(t, torch.Tensor)]
    precision = call.precision
    key = repr([_fingerprint(call, None), shapes, str(precision.autocast_dtype), precision.autocast_enabled])
    return os.path.join(cache.path, PROGRAMS_DIR, "unit-" + hashlib.sha1(key.encode()).hexdigest()[:20])


def _fingerprint(call, ops, regions=False) -> str:
    """The program's identity as far as a compile cache sees it: what it computes, not its values."""
    model, geometry = call.model, call.geometry
    parts = [type(model).__qualname__, call.training, ops, regions, torch.__version__, program_source(),
             torch.get_num_threads(),
             geometry.device_iterations, geometry.gradient_accumulation, geometry.replication_factor]
    parts += [(name, tuple(t.shape), str(t.dtype), t.requires_grad)
              for name, t in [*model.named_parameters(), *model.named_buffers()]]
    if call.training:
        parts += [type(call.optimizer).__qualname__, len(call.optimizer.param_groups)]
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:20]
