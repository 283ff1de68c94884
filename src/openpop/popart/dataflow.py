"""``popart.DataFlow`` and ``popart.AnchorReturnType``: what a ``run`` returns, and how often."""
from collections.abc import Iterable
from typing import Optional, Union

from . import messages
from .enums import AnchorReturnTypeId, ExchangeStrategy, TileSet
from .errors import popart_exception

_BY_NAME = {"final": AnchorReturnTypeId.Final, "everyn": AnchorReturnTypeId.EveryN,
            "all": AnchorReturnTypeId.All, "sum": AnchorReturnTypeId.Sum}


class AnchorReturnType:
    """``AnchorReturnType("All" | "Final" | "Sum")`` or ``AnchorReturnType("EveryN", N)``
    (names are case-insensitive)."""

    def __init__(self, artString: str, returnPeriod: Optional[int] = None, tileSet=TileSet.Compute,
                 exchangeStrategy=ExchangeStrategy.JustInTime):
        key = str(artString).lower()
        if key not in _BY_NAME:
            raise popart_exception(messages.INVALID_ANCHOR_RETURN_TYPE.format(artString=artString))
        self._id = _BY_NAME[key]
        if self._id == AnchorReturnTypeId.EveryN:
            if returnPeriod is None:
                raise popart_exception(messages.RETURN_PERIOD_MISSING)
            if int(returnPeriod) <= 0:
                raise popart_exception(messages.RETURN_PERIOD_NOT_POSITIVE)
            self._period = int(returnPeriod)
        else:
            if returnPeriod is not None:
                raise popart_exception(messages.RETURN_PERIOD_NOT_EXPECTED.format(artString=artString))
            self._period = 0
        self.tileSet = tileSet
        self.exchangeStrategy = exchangeStrategy

    def id(self) -> AnchorReturnTypeId:
        return self._id

    def rp(self) -> int:
        return self._period

    def str(self) -> str:
        return {AnchorReturnTypeId.Final: "FINAL", AnchorReturnTypeId.EveryN: "EVERYN",
                AnchorReturnTypeId.All: "ALL", AnchorReturnTypeId.Sum: "SUM"}[self._id]

    def __repr__(self):
        return f"AnchorReturnType({self.str()}" + (f", {self._period})" if self._period else ")")


class DataFlow:
    """``DataFlow(batchesPerStep, {id: AnchorReturnType})`` or ``DataFlow(batchesPerStep, [ids],
    anchorReturnType=AnchorReturnType("All"))``."""

    def __init__(self, batchesPerStep: int,
                 anchorTensors: Optional[Union[dict[str, AnchorReturnType], Iterable[str]]] = None,
                 anchorReturnType: AnchorReturnType = None):
        if int(batchesPerStep) < 1:
            raise popart_exception(messages.BATCHES_PER_STEP_BELOW_ONE.format(batchesPerStep=batchesPerStep))
        self._bps = int(batchesPerStep)
        anchors = anchorTensors if anchorTensors is not None else {}
        if isinstance(anchors, dict):
            if anchorReturnType is not None:
                raise popart_exception(messages.DATAFLOW_ANCHORS_ARGUMENTS)
            self._anchors = dict(anchors)
        else:
            art = anchorReturnType if anchorReturnType is not None else AnchorReturnType("All")
            self._anchors = dict.fromkeys(anchors, art)
        for tensor_id, art in self._anchors.items():
            if not isinstance(art, AnchorReturnType):
                raise popart_exception(messages.ANCHOR_NOT_A_RETURN_TYPE.format(
                    tensor_id=tensor_id, art=art))

    def batchesPerStep(self) -> int:
        return self._bps

    def anchors(self):
        return list(self._anchors)

    def nAnchors(self) -> int:
        return len(self._anchors)

    def isAnchored(self, tensorId: str) -> bool:
        return tensorId in self._anchors

    def art(self, anchorId: str) -> AnchorReturnType:
        if anchorId not in self._anchors:
            raise popart_exception(messages.TENSOR_IS_NOT_ANCHORED.format(anchorId=anchorId))
        return self._anchors[anchorId]

    def isBatchCountingRequired(self) -> bool:
        return any(a.id() == AnchorReturnTypeId.EveryN for a in self._anchors.values())

    def validate(self) -> None:
        """PopART's check: an EveryN period must divide batchesPerStep."""
        for tensor_id, art in self._anchors.items():
            if art.id() == AnchorReturnTypeId.EveryN:
                if art.rp() > self._bps:
                    raise popart_exception(messages.RETURN_PERIOD_ABOVE_BATCHES_PER_STEP.format(
                        tensor_id=tensor_id, rp=art.rp(), bps=self._bps))
                if self._bps % art.rp() != 0:
                    raise popart_exception(messages.BATCHES_PER_STEP_NOT_A_MULTIPLE.format(
                        tensor_id=tensor_id, rp=art.rp(), bps=self._bps))
