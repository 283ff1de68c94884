"""The execution plan: blocks -> stages -> virtual IPUs -> torch devices.

Built once, on the compile pass, from the blocks the forward pass met (recorded by
``BlockRecorder``), the execution strategy and the options; validated with PopTorch's rules
and texts before anything runs.

Rules (PopTorch's): a block's stage comes from the strategy (an explicit ``Stage``/``Phase``
naming it, else ``AutoStage.SameAsIpu`` -> its ``ipu_id``, ``AutoIncrement`` -> the next id);
its IPU is ``Stage.ipu()`` if set, else the block's ``ipu_id``, else the stage id. Ops before
the first block run on IPU 0. Consecutive blocks on the same IPU form one pipeline stage.
"""
import contextlib
from dataclasses import dataclass, field
from typing import Optional

import torch

from .. import errors
from ..enums import AutoStage
from ..log import logger
from ..torch_compat import TorchDispatchMode
from .devices import DeviceMap

IMPLICIT_BLOCK = "__before_first_block__"

PIPELINE_GA = ("poptorch.Options().Training.gradientAccumulation must be greater than or equal to the "
               "number of pipeline stages ({stages}) when using poptorch.PipelinedExecution. Please note "
               "that a model with {fwd} pipeline stages in PopTorch will have an additional {extra} stages "
               "when training.")
PIPELINE_DI = ("poptorch.Options().deviceIterations must be greater than or equal to the number of pipeline "
               "stages ({stages}) when using PopTorch.PipelinedExecution.")
IPU_COUNT_POW2 = ("The model specifies the use of {n} IPUs, however PopTorch must reserve a minimum of "
                  "{rounded} in order to allow the model to run, because PopTorch must reserve a power of 2 "
                  "or maximum of 64 IPUs per process. Please reconfigure your model to use a different "
                  "number of IPUs or set poptorch.Options().autoRoundNumIPUs(True).")
IPU_COUNT_MAX = ("Too many IPUs requested ({n}). Experiments that need more than 64 IPUs require distributed "
                 "execution.")


@dataclass
class RecordedBlock:
    user_id: str
    ipu_id: Optional[int]
    modules: list[str] = field(default_factory=list)  # qualified names entered while active


class BlockRecorder:
    """Collects, during one forward pass, the blocks in the order they start and the modules
    that run in each (the run context's ``block_recorder``)."""

    def __init__(self, model: torch.nn.Module):
        self.blocks: list[RecordedBlock] = [RecordedBlock(IMPLICIT_BLOCK, None)]
        self._by_id: dict[str, RecordedBlock] = {}
        self._current: Optional[RecordedBlock] = self.blocks[0]
        self._waiting: list[str] = []  # modules entered while no block was active
        self._own_ops = 0  # > 0 while openpop itself computes inside the forward (allowing_ops)
        self._names = {m: name for name, m in model.named_modules(remove_duplicate=False)}
        self._handles = []
        # recomputationCheckpoint() appends the tensors it marks here (the run context's
        # ``checkpoints``); modules returning one of them become recomputation units.
        self.checkpoints: list[torch.Tensor] = []
        self.checkpoint_modules: list[str] = []
        for module in self._names:
            if module is not model:
                self._handles.append(module.register_forward_pre_hook(self._module_entered))
                self._handles.append(module.register_forward_hook(self._module_exited))

    def begin_block(self, user_id: str, ipu_id: Optional[int]) -> None:
        block = self._by_id.get(user_id)
        if block is None:
            block = RecordedBlock(user_id, ipu_id)
            self._by_id[user_id] = block
            self.blocks.append(block)
        self._current = block
        block.modules.extend(self._waiting)
        self._waiting = []

    def end_block(self) -> None:
        self._current = None

    def checking_ops(self) -> "OpsOutsideBlocks":
        """Context for the forward pass: an op run while no block is active raises PopTorch's
        "No active Block" error (``OpsOutsideBlocks``)."""
        return OpsOutsideBlocks(self)

    @contextlib.contextmanager
    def allowing_ops(self):
        """openpop's own ops inside a traced forward (a front-end wrapping the user's loss) are
        in no user block: ``checking_ops`` lets them pass."""
        self._own_ops += 1
        try:
            yield
        finally:
            self._own_ops -= 1

    @property
    def block_active(self) -> bool:
        """Whether an op now belongs to a block (or is openpop's own, see ``allowing_ops``)."""
        return self._current is not None or self._own_ops > 0

    def _module_entered(self, module, inputs):
        name = self._names[module]
        block = self._current
        if block is None:  # its ops, if any, raise; a block it starts itself gets the module
            self._waiting.append(name)
            return
        block.modules.append(name)

    def _module_exited(self, module, inputs, output):
        if not self.checkpoints:
            return
        marked = {id(t) for t in self.checkpoints}
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        if any(isinstance(o, torch.Tensor) and id(o) in marked for o in outputs):
            name = self._names[module]
            if name not in self.checkpoint_modules:
                self.checkpoint_modules.append(name)

    def recomputation_units(self) -> list[str]:
        """Innermost modules whose output was marked by ``recomputationCheckpoint``."""
        units = self.checkpoint_modules
        return [n for n in units if not any(other.startswith(n + ".") for other in units)]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def used_blocks(self) -> list[RecordedBlock]:
        blocks = [b for b in self.blocks if b.user_id != IMPLICIT_BLOCK or b.modules]
        return blocks


class OpsOutsideBlocks(TorchDispatchMode):
    """While entered, every op (aten call) run after a ``with Block`` ended and before the next
    block started raises ``Error(NO_ACTIVE_BLOCK)``, as PopTorch's compiler does. Ops before
    the first block belong to stage 0; aliases and detaches compute nothing and are let pass."""

    _NOT_OPS = frozenset({torch.ops.aten.detach, torch.ops.aten.alias, torch.ops.aten.lift_fresh})

    def __init__(self, recorder: BlockRecorder):
        super().__init__()
        self._recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._recorder.block_active and func.overloadpacket not in self._NOT_OPS:
            raise errors.Error(errors.with_fix(errors.NO_ACTIVE_BLOCK,
                                               errors.NO_ACTIVE_BLOCK_FIX.format(op=f"aten.{func.overloadpacket.__name__}")))
        return func(*args, **(kwargs or {}))


@dataclass
class PlannedBlock:
    name: str               # what the allocation table shows
    user_id: str
    stage: int
    ipu: int
    modules: list[str]


@dataclass
class ExecutionPlan:
    blocks: list[PlannedBlock]
    pipeline_stages: int    # forward stages: IPU switches in block order + 1
    ipus_per_replica: int
    pipelined: bool         # PipelinedExecution with more than one stage
    device_map: Optional[DeviceMap] = None
    recomputation_units: list[str] = field(default_factory=list)  # see BlockRecorder

    def device_visits(self, replica: int = 0) -> dict[torch.device, int]:
        """How many separate times one forward pass of ``replica`` runs on each device: the
        root module starts on IPU 0's device, then the blocks in order (a device holding
        stages 0 and 2 of a round-robin map is visited twice)."""
        visits: dict[torch.device, int] = {}
        previous = None
        for ipu in [0] + [block.ipu for block in self.blocks]:
            device = self.device_map.device(ipu, replica)
            if device != previous:
                visits[device] = visits.get(device, 0) + 1
            previous = device
        return visits

    def allocation_table(self) -> str:
        width = max([len(b.name) for b in self.blocks] + [1])
        lines = ["-" * 59, "-" * 20 + " Device Allocation " + "-" * 20]
        for block in self.blocks:
            line = f"{block.name:<{width}} --> IPU {block.ipu}"
            if self.device_map is not None:
                line += f" ({self.device_map.device(block.ipu)})"
            lines.append(line)
        lines.append("-" * 59)
        return "\n".join(lines)


def build_plan(recorder: BlockRecorder, settings) -> ExecutionPlan:
    """Assign stages and IPUs to the recorded blocks and check PopTorch's rules
    (``settings``: ``settings.RunSettings``)."""
    strategy = settings.strategy
    geometry = settings.geometry
    planned = []
    auto_counter = 0
    for block in recorder.used_blocks():
        name = block.user_id
        if block.user_id == IMPLICIT_BLOCK:
            stage, ipu = 0, 0
            name = ", ".join(top_modules(block.modules)) or "(model)"
        else:
            explicit = strategy.stage_of(block.user_id)
            if explicit is not None:
                stage, stage_obj = explicit
                chosen = stage_obj._ipu
            else:
                strategy.assert_known_block(block.user_id)
                stage_obj, chosen = None, None
                if strategy.auto_stage == AutoStage.AutoIncrement:
                    stage = auto_counter
                    auto_counter += 1
                else:
                    if block.ipu_id is None:
                        raise errors.createPoptorchError(errors.SAME_AS_IPU_WITHOUT_IPU.format(block_id=block.user_id))
                    stage = block.ipu_id
            ipu = chosen if chosen is not None else (block.ipu_id if block.ipu_id is not None else stage)
            if hasattr(strategy, "check_phase_ipu") and stage_obj is not None:
                strategy.check_phase_ipu(stage_obj._phase_id, ipu)
            if block.user_id.isdigit() and block.modules:
                name = ", ".join(top_modules(block.modules))
        planned.append(PlannedBlock(name, block.user_id, stage, ipu, list(block.modules)))

    switches = sum(1 for a, b in zip(planned, planned[1:]) if a.ipu != b.ipu)
    fwd_stages = switches + 1
    used_ipus = {b.ipu for b in planned} or {0}
    ipus_per_replica = max(len(used_ipus), max(used_ipus) + 1)
    pipelined = settings.pipelined_strategy and fwd_stages > 1
    plan = ExecutionPlan(planned, fwd_stages, ipus_per_replica, pipelined,
                         recomputation_units=recorder.recomputation_units())
    _check_ipu_count(ipus_per_replica * geometry.replication_factor, settings.auto_round_num_ipus)
    if pipelined and settings.training:
        total = 2 * fwd_stages - 1
        if geometry.gradient_accumulation < total:
            raise errors.PipelineDepthError(PIPELINE_GA.format(stages=total, fwd=fwd_stages, extra=total - fwd_stages),
                                            stages=fwd_stages)
    if pipelined and not settings.training and geometry.device_iterations < fwd_stages:
        raise errors.PipelineDepthError(PIPELINE_DI.format(stages=fwd_stages), stages=fwd_stages)
    return plan


def _check_ipu_count(n: int, auto_round: bool) -> None:
    if n > 64:
        raise errors.createPoptorchError(IPU_COUNT_MAX.format(n=n))
    rounded = 1
    while rounded < n:
        rounded *= 2
    if rounded != n:
        if not auto_round:
            raise errors.createPoptorchError(IPU_COUNT_POW2.format(n=n, rounded=rounded))
        logger.warning(errors.RESERVING_IPUS, rounded, n, rounded - n)


def top_modules(names: list[str]) -> list[str]:
    """The outermost module names of a block, in order, without repeats."""
    result = []
    for name in names:
        if name in result or any(name.startswith(top + ".") for top in result):
            continue
        result.append(name)
    return result
