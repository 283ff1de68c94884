"""The compiled backend's second unit, ``"regions"``: the model's blocks compiled one by one (torch's
regional compilation), each host call run as the eager backend runs it.

The whole-host-call program (``program.py``) takes the host out from between the ops, which is
what a small model needs (the tiny MLP's steps: 12x faster). A model whose ops each take
milliseconds (BERT-base, micro-batch 8 x 128 tokens: ~3.4 ms per aten op) spends next to nothing
in the host, and the whole program's price stays: a compile that traces and compiles every layer
(BERT-base: ~3 min on 2 cores) and a functional gradient accumulation that copies what eager
adds in place. Compiling each *block* instead keeps what Inductor's fusions save inside the
layers, while identical blocks (the encoder layers) share one compiled graph: Dynamo traces a
``forward`` code object once and the blocks' parameters are its inputs, so the compile costs
what one layer's does. The host call, its micro-batch loop, autograd's in-place accumulation,
gradient reduction, loss scaling and the optimizer's ``step()`` are the eager backend's (the
reference), so the semantics are eager's by construction; the optimizer's update itself runs
fused when it is openpop's LAMB, Adam or AdamW (``fused_updates.py``).

Regions (``find_regions``): walking down from the model, a child with parameters is a region
unless it holds repeated blocks - two children of one module with the same class and parameter
shapes that are themselves made of modules (an encoder layer; not the three Linear projections of
an attention) - or has no ``forward`` (``ModuleList``), in which case its children are visited
instead. A region whose ``forward`` the model does not call (BERT's ``BertModel`` when the
pretraining model calls its embeddings and layers itself; a ``LightningModule`` whose
``training_step`` calls its layers) is found when the first micro-batch compiles the regions, and
the regions under it take its place. The model itself is never a region: its forward (the loss,
Lightning's step) and every module's hooks run eagerly; only the regions' ``forward`` methods are
compiled, installed on the modules for the host call and removed after it. Random numbers come
from aten's ops (Inductor's ``fallback_random``) in eager's order, so dropout masks equal eager's
bit for bit (drawn by a vectorised kernel of the same stream where that equals aten's:
``dropout_masks.py``).
"""
import contextlib
import functools

import torch

from .. import context
from ..pipeline import RECOMPUTED
from ..schedules import LossForward
from ..weights import BufferSnapshot
from .attention_backward import ShortAttentionBackward
from .dropout_masks import FastDropoutMasks
from .eligibility import first_micro_batch
from .fused_updates import FusedUpdate
from .generator_states import RngState
from .onednn_matmuls import OneDnnMatmuls

# A model whose probe micro-batch does at least this many floating-point operations per aten op
# on a device type runs as regions under ``unit="auto"`` (selection.py): its kernels then take long
# enough that the host's per-op cost, which the whole program removes, is a small share, while
# the whole program's compile is not. Counted, not timed: a busy machine chooses as an idle one.
# On the CPU 1e8 is ~1 ms per op at ~100 GFLOP/s: BERT-base (micro-batch 8 x 128) does 5.7e8 per
# op, BERT tiny (2 x 128) 2.8e7, the tests' MLPs under 3e6. CUDA computes ~100x faster per op.
REGIONS_FLOPS_PER_OP = {"cpu": 1e8, "cuda": 1e10}


def regions_pay(flops_per_op: float, device_type: str) -> bool:
    """Whether ``unit="auto"`` takes regions for a model doing ``flops_per_op`` per aten op."""
    threshold = REGIONS_FLOPS_PER_OP.get(device_type, REGIONS_FLOPS_PER_OP["cpu"])
    return flops_per_op >= threshold


def _signature(module):
    return type(module), tuple((name, tuple(p.shape), p.dtype) for name, p in module.named_parameters())


def _holds_repeats(module) -> bool:
    """Whether ``module`` or a module under it has two children that are the same block."""
    for parent in module.modules():
        seen = set()
        for child in parent.children():
            if next(child.children(), None) is None:  # a leaf (Linear, LayerNorm) is not a block
                continue
            signature = _signature(child)
            if signature in seen:
                return True
            seen.add(signature)
    return False


def find_regions(model: torch.nn.Module) -> list:
    """The modules whose ``forward`` is compiled (module docstring), in module order."""
    regions, seen = [], set()

    def visit(module):
        for child in module.children():
            if id(child) in seen or next(child.parameters(), None) is None:
                continue
            seen.add(id(child))
            if _holds_repeats(child) or type(child).forward is torch.nn.Module.forward:  # (ModuleList, ModuleDict)
                visit(child)
            else:
                regions.append(child)

    visit(model)
    return regions


def distinct_share(model: torch.nn.Module, regions) -> tuple:
    """``(share, graphs)``: the share of the model's modules that are compiled or run as distinct
    code (a repeated block counts once), and how many distinct regions there are - what the compile
    cost estimate scales by (``compile_cost.py``)."""
    total = sum(1 for _ in model.modules())
    seen, repeated = set(), 0
    for region in regions:
        signature = tuple(_signature(m) for m in region.modules())
        if signature in seen:
            repeated += sum(1 for _ in region.modules())
        seen.add(signature)
    return (total - repeated) / total, len(seen)


def compile_options(device, training: bool) -> dict:
    """Inductor's options for a region: aten's random ops (eager's masks); on CPU, large float32
    matrix products on oneDNN where this CPU runs them faster (``onednn_matmuls.py``) and, in
    training, short attention's backward as tensor math (``attention_backward.py``) and dropout
    masks from a vectorised kernel where its draws equal aten's (``dropout_masks.py``)."""
    from .passes import active  # (the registry: each pass's switch and probe)
    options = {"fallback_random": True}
    if device.type != "cpu":
        return options
    passes = []
    if training:
        if active("attention_backward"):
            options["post_grad_custom_pre_pass"] = ShortAttentionBackward()
        if active("dropout_masks"):
            passes.append(FastDropoutMasks())
    if active("onednn_matmuls"):
        passes.append(OneDnnMatmuls())
    if passes:
        options["post_grad_custom_post_pass"] = passes  # (Inductor runs a list in order; their uuids key its caches)
    return options


class CompiledRegions:
    """The compiled ``forward`` of every region of the executor's models (each replica's own,
    the same regions by position)."""

    def __init__(self, models, training: bool):
        self._models = list(models)
        device = next(iter(self._models[0].parameters()), torch.empty(0)).device
        self._options = compile_options(device, training)
        self._training = training
        self._fused = (None, None)  # (optimizer, its FusedUpdate or None)
        self._forwards = []  # per model: [(region, its compiled forward)]
        self._set_regions([find_regions(model) for model in self._models])

    def _set_regions(self, regions_per_model):
        keep = _outermost(regions_per_model[0])  # (replicas are copies: the same positions)
        self._forwards = [[(regions[i], torch.compile(regions[i].forward, dynamic=False, options=self._options))
                           for i in keep] for regions in regions_per_model]
        self.regions = [regions_per_model[0][i] for i in keep]
        self.share, self.graphs = distinct_share(self._models[0], self.regions)

    def fused_update(self, optimizer):
        """The ``FusedUpdate`` of a training host call's ``optimizer`` (``fused_updates.py``), or
        None: the optimizer's own update runs."""
        if optimizer is None or not self._training:
            return None
        if self._fused[0] is not optimizer:  # (setOptimizer)
            self._fused = (optimizer, FusedUpdate(optimizer) if FusedUpdate.supports(optimizer) else None)
        return self._fused[1]

    @contextlib.contextmanager
    def installed(self, optimizer=None, calls=None):
        """The compiled forwards in place of the regions' own for a host call, and the
        optimizer's fused update (``calls``, a set: records which regions of the first model
        ran). A forward wrapped for recomputation (``pipeline.Recomputation``, entered before)
        stays wrapped, around the compiled one."""
        pairs = [pair for forwards in self._forwards for pair in forwards]
        previous = []
        fused = self.fused_update(optimizer)
        try:
            for index, (module, forward) in enumerate(pairs):
                if calls is not None and index < len(self.regions):
                    forward = _recording(forward, calls, index)
                before = module.__dict__.get("forward")
                previous.append((module, before))
                if isinstance(before, functools.partial) and before.func in RECOMPUTED:
                    forward = functools.partial(before.func, forward, *before.args[1:], **before.keywords)
                module.__dict__["forward"] = forward
            with fused.installed() if fused is not None else contextlib.nullcontext():
                yield
        finally:
            for module, before in reversed(previous):
                if before is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.__dict__["forward"] = before

    def compile(self, call, inputs, executable) -> None:
        """Compile the regions now by running the call's first micro-batch through them. A region
        whose ``forward`` did not run (the model calls its children directly) is replaced by the
        regions under it, and the micro-batch runs again until every region ran."""
        fused = self.fused_update(call.optimizer if call.training else None)
        if fused is not None:
            fused.warm_up()
        while self.regions:
            calls = set()
            self._run_first_micro_batch(call, inputs, executable, calls)
            if len(calls) == len(self.regions):
                return
            finer = [[] for _ in self._models]
            for index in range(len(self.regions)):
                for model_regions, forwards in zip(finer, self._forwards):
                    region = forwards[index][0]
                    model_regions.extend([region] if index in calls else find_regions(region))
            self._set_regions(finer)

    def _run_first_micro_batch(self, call, inputs, executable, calls) -> None:
        """Forward and (training) backward of the first micro-batch with the compiled regions,
        leaving no trace: gradients are returned, not accumulated; the buffers the call runs on
        and torch's generators are put back; it runs as a trace (nothing logged, printed or
        counted as a micro-batch, ``context.RunContext.tracing``)."""
        model = call.model
        rng = RngState()
        with call.session.running(call.training, call.precision), \
                torch.set_grad_enabled(call.training):
            context.current().tracing = True
            snapshot = BufferSnapshot(list(model.buffers()), model)  # (the device's, inside running())
            try:
                with self.installed(calls=calls):
                    (args, kwargs), _ = first_micro_batch(call, inputs)
                    if not call.training:
                        with call.precision.forward(model):
                            model(*args, **kwargs)
                        return
                    _, loss = LossForward(executable, call.precision)(model, args, kwargs)
                    trained = [p for p in executable.trainable if p.requires_grad]
                    if loss.requires_grad and trained:
                        torch.autograd.grad(loss.sum(), trained, allow_unused=True)
            finally:
                snapshot.restore()
                rng.restore()


def _outermost(regions) -> list:
    """Positions of the regions that are neither repeated nor inside another one (a module
    shared between parents is found twice when the regions are refined)."""
    inner = {id(m) for region in regions for m in region.modules() if m is not region}
    seen, keep = set(), []
    for index, region in enumerate(regions):
        if id(region) in seen or id(region) in inner:
            continue
        seen.add(id(region))
        keep.append(index)
    return keep


def _recording(forward, calls, index):
    def recorded(*args, **kwargs):
        calls.add(index)
        return forward(*args, **kwargs)
    return recorded
