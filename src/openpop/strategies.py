"""Execution strategies: how a model's blocks are grouped into stages and phases.

A *block* is a part of the model named by a ``user_id`` (``poptorch.Block``,
``BeginBlock``). A ``Stage`` groups blocks that run on one virtual IPU; a ``Phase``
groups stages that run at the same time. A strategy is the user's choice of
grouping plus how stages follow each other:

* ``PipelinedExecution`` - stages form a pipeline (backend ``execution_mode`` 0);
* ``ShardedExecution`` - stages run one after the other (``execution_mode`` 1);
* ``SerialPhasedExecution`` / ``ParallelPhasedExecution`` - phases
  (``execution_mode`` 2).

Everything here is plain data. The plan builder (``openpop.runtime``) turns it into
stages -> virtual IPUs with these rules:

* ``strategy.stage_of(block_id)`` gives ``(stage_index, Stage)`` for blocks the user
  placed explicitly, else None. ``strategy.assert_known_block(block_id)`` raises
  PopTorch's "Unknown Block" error for a block an explicit strategy does not list.
* ``strategy.auto_stage`` is the ``AutoStage`` rule for pipelined/sharded strategies
  built without explicit stages (None otherwise): ``SameAsIpu`` -> stage id = the
  block's ``ipu_id`` (missing ``ipu_id`` -> ``errors.SAME_AS_IPU_WITHOUT_IPU``),
  ``AutoIncrement`` -> each new block gets the next stage id.
* IPU of a block = ``stage._ipu`` if ``Stage.ipu(n)`` was called, else the block's
  ``ipu_id``, else the stage id.
* ``ParallelPhasedExecution.check_phase_ipu(phase, ipu)`` enforces the even/odd rule
  for every resolved IPU; ``validate()`` checks the IPUs assigned with ``.ipu()`` /
  ``Phase.ipus()`` up front.
"""
from typing import Optional, Union

from . import enums, errors
from .errors import Error, createPoptorchError
from .log import logger

BlockId = str



def check_ipu_index(ipu, where: str, name: str = "ipu_id") -> None:
    """Raise ``poptorch.Error`` unless ``ipu`` is a virtual IPU index: an int >= 0 (not a bool)."""
    if isinstance(ipu, bool) or not isinstance(ipu, int) or ipu < 0:
        raise createPoptorchError(errors.IPU_INDEX.format(where=where, name=name, ipu=ipu))


class Stage:
    """One or more blocks that run together on one (virtual) IPU."""

    def __init__(self, *block_ids: BlockId) -> None:
        if not all(isinstance(b, str) for b in block_ids):
            raise AssertionError(errors.BLOCK_IDS_NOT_STRINGS.format(block_ids=block_ids))
        self._blocks = list(block_ids)
        self._ipu: Optional[int] = None  # set by .ipu(); None -> from the block or the stage id
        self._stage_id = -1  # position in the owning strategy
        self._phase_id = -1  # owning phase, phased strategies only

    @property
    def blocks(self) -> list[BlockId]:
        """The ids of the blocks this stage is made of."""
        return list(self._blocks)

    def ipu(self, ipu: int) -> "Stage":
        """Run this stage on virtual IPU ``ipu``."""
        errors.check_type(ipu, int, "Stage.ipu", "ipu")
        check_ipu_index(ipu, "Stage.ipu", name="ipu")
        self._ipu = ipu
        return self

    def __repr__(self) -> str:
        ipu = "" if self._ipu is None else f".ipu({self._ipu})"
        return "Stage(" + ", ".join(repr(b) for b in self._blocks) + ")" + ipu


class Phase:
    """Stages that execute in parallel.

    ``Phase(Stage("A"), Stage("B"))`` has two stages; ``Phase("A", "B")`` has one
    stage made of blocks A and B.
    """

    def __init__(self, *arg: Union[BlockId, Stage]) -> None:
        if all(isinstance(elt, Stage) for elt in arg):
            self.stages: list[Stage] = list(arg)
        else:
            if not all(isinstance(elt, str) for elt in arg):
                raise AssertionError(errors.PHASE_ARGUMENTS.format(types=[type(elt) for elt in arg]))
            self.stages = [Stage(*arg)]

    def stage(self, idx: int) -> Stage:
        return self.stages[idx]

    def ipus(self, *ipus: int) -> "Phase":
        """Give each stage of this phase its IPU, in order."""
        if len(ipus) != len(self.stages):
            raise AssertionError(errors.PHASE_IPU_COUNT.format(stages_count=len(self.stages), ipus_count=len(ipus)))
        for stage, ipu in zip(self.stages, ipus):
            stage.ipu(ipu)
        return self

    def __repr__(self) -> str:
        return "Phase(" + ", ".join(repr(s) for s in self.stages) + ")"


class _IExecutionStrategy:
    """What every strategy offers: its stages, block lookups and backend options."""

    pipelines = False  # micro-batches flow through the stages concurrently (PipelinedExecution)

    def __init__(self, stages: list[Stage], auto_stage: Optional[enums.AutoStage]) -> None:
        self._stages = stages
        self.auto_stage = auto_stage
        self._block_map = _map_blocks(stages)
        for index, stage in enumerate(stages):
            stage._stage_id = index
            for block_id in stage.blocks:
                logger.debug("block %s added to stage %d%s", block_id, index,
                             "" if stage._ipu is None else f" on IPU {stage._ipu}")

    @property
    def stages(self) -> list[Stage]:
        """The explicitly defined stages, in order (empty when an AutoStage rule is used)."""
        return list(self._stages)

    def stage(self, block_id: BlockId) -> Stage:
        """The ``Stage`` block ``block_id`` belongs to."""
        if block_id not in self._block_map:
            raise AssertionError(errors.NO_SUCH_BLOCK.format(block_id=block_id))
        return self._block_map[block_id]

    def stage_of(self, block_id: BlockId) -> Optional[tuple[int, Stage]]:
        """``(stage_index, Stage)`` of an explicitly placed block, else None."""
        stage = self._block_map.get(block_id)
        if stage is None:
            return None
        return stage._stage_id, stage

    def assert_known_block(self, block_id: BlockId) -> None:
        """Raise PopTorch's error for a block an explicit strategy does not list."""
        if self.auto_stage is None:
            if block_id not in self._block_map:
                raise AssertionError(errors.UNKNOWN_BLOCK.format(
                block_id=block_id, expected=list(self._block_map.keys())))

    def validate(self) -> None:
        """Check what can be checked before tracing (see ``ParallelPhasedExecution``)."""

    def backendOptions(self) -> dict[str, Union[int, bool]]:
        raise NotImplementedError


class PipelinedExecution(_IExecutionStrategy):
    """Pipeline the stages over the micro-batches.

    Arguments: nothing (``AutoStage.SameAsIpu``), a single ``AutoStage``, or one
    entry per stage, each a ``Stage``, a block id or a list of block ids.
    """

    pipelines = True

    def __init__(self, *args: Union[enums.AutoStage, Stage, BlockId, list[BlockId]]) -> None:
        if not args:
            super().__init__([], enums.AutoStage.SameAsIpu)
            return
        if len(args) == 1 and isinstance(args[0], enums.AutoStage):
            super().__init__([], args[0])
            return
        if any(isinstance(a, enums.AutoStage) for a in args):
            raise AssertionError(errors.AUTO_STAGE_NOT_ALONE)
        super().__init__([_as_stage(arg) for arg in args], None)

    def backendOptions(self) -> dict[str, Union[int, bool]]:
        return {"execution_mode": 0}


class ShardedExecution(PipelinedExecution):
    """Run the stages one after the other, without pipelining (same arguments)."""

    pipelines = False

    def backendOptions(self) -> dict[str, Union[int, bool]]:
        return {"execution_mode": 1}


class _IPhasedExecution(_IExecutionStrategy):
    """Common base of the phased strategies.

    Each phase is a ``Phase``, a list of ``Stage`` or a list of block ids (one stage).
    Stages are numbered in order across phases.
    """

    def __init__(self, *phases: Union[Phase, list[Stage], list[BlockId], Stage, BlockId]) -> None:
        if not phases:
            raise AssertionError(errors.NO_PHASES)
        self._phases: list[Phase] = [_as_phase(p) for p in phases]
        self._tensors_liveness = enums.Liveness.AlwaysLive
        self._separate_backward_phase = False
        stages = [stage for phase in self._phases for stage in phase.stages]
        _map_blocks(stages)  # reject a block in two stages before touching any Stage
        for phase_id, phase in enumerate(self._phases):
            for stage in phase.stages:
                stage._phase_id = phase_id
        super().__init__(stages, None)

    @property
    def phases(self) -> list[Phase]:
        return list(self._phases)

    def phase(self, phase: int) -> Phase:
        """The ``Phase`` at index ``phase``."""
        if not (isinstance(phase, int) and phase >= 0):
            raise AssertionError(errors.PHASE_INDEX)
        return self._phases[phase]

    def useSeparateBackwardPhase(self, use: bool = True) -> "_IPhasedExecution":
        """Give the backward pass its own phases instead of sharing the last forward one."""
        errors.check_type(use, bool, "_IPhasedExecution.useSeparateBackwardPhase", "use")
        self._separate_backward_phase = use
        return self

    def backendOptions(self) -> dict[str, Union[int, bool]]:
        return {
            "execution_mode": 2,
            "separate_backward_phase": self._separate_backward_phase,
            "tensors_liveness": int(self._tensors_liveness),
        }


class SerialPhasedExecution(_IPhasedExecution):
    """All phases run one after the other on the same group of IPUs."""

    def setTensorsLiveness(self, liveness: enums.Liveness) -> "SerialPhasedExecution":
        errors.check_type(liveness, enums.Liveness, "SerialPhasedExecution.setTensorsLiveness", "liveness")
        self._tensors_liveness = liveness
        return self

    def backendOptions(self) -> dict[str, Union[int, bool]]:
        return {**super().backendOptions(), "serial_phases_execution": True}


class ParallelPhasedExecution(_IPhasedExecution):
    """Phases alternate between two groups of IPUs: even phases on even IPUs,
    odd phases on odd IPUs."""

    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True) -> "ParallelPhasedExecution":
        errors.check_type(off_chip, bool, "ParallelPhasedExecution.sendTensorsOffChipAfterFwd", "off_chip")
        self._tensors_liveness = (enums.Liveness.OffChipAfterFwd if off_chip
                                  else enums.Liveness.AlwaysLive)
        return self

    def check_phase_ipu(self, phase_id: int, ipu: int) -> None:
        """Raise ``Error`` if phase ``phase_id`` may not run on IPU ``ipu``."""
        if phase_id % 2 != ipu % 2:
            raise Error(errors.PARALLEL_PHASE_PARITY)

    def validate(self) -> None:
        for stage in self._stages:
            if stage._ipu is not None:
                self.check_phase_ipu(stage._phase_id, stage._ipu)

    def backendOptions(self) -> dict[str, Union[int, bool]]:
        return {**super().backendOptions(), "serial_phases_execution": False}


def _map_blocks(stages: list[Stage]) -> dict[BlockId, Stage]:
    block_map: dict[BlockId, Stage] = {}
    for stage in stages:
        for block_id in stage.blocks:
            if block_id in block_map:
                raise AssertionError(errors.BLOCK_IN_TWO_STAGES.format(block_id=block_id))
            block_map[block_id] = stage
    return block_map


def _as_stage(arg) -> Stage:
    if isinstance(arg, Stage):
        return arg
    if isinstance(arg, str):
        return Stage(arg)
    if not (isinstance(arg, (list, tuple)) and all(isinstance(b, str) for b in arg)):
        raise AssertionError(errors.STAGE_ARGUMENT.format(arg=arg))
    return Stage(*arg)


def _as_phase(arg) -> Phase:
    if isinstance(arg, Phase):
        return arg
    if isinstance(arg, (list, tuple)):
        return Phase(*arg)
    return Phase(arg)


__all__ = [
    "ParallelPhasedExecution",
    "Phase",
    "PipelinedExecution",
    "SerialPhasedExecution",
    "ShardedExecution",
    "Stage",
]
