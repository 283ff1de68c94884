"""``popart.VariableSettings``: how a variable is shared across replicas (by a ``CommGroup`` or a
stride and group size) and how it is read back, with PopART's arithmetic of groups, representatives
and host shapes. openpop's replicas hold one copy of each weight, so a variable is read back as
PopART would return it and grouped initial values are accepted; the groups do not keep separate
values during training."""
from .enums import CommGroupType, VariableRetrievalMode
from .options import CommGroup


class VariableSettings:
    """``VariableSettings()``, ``(CommGroup)``, ``(VariableRetrievalMode)``, ``(CommGroup, mode)``,
    ``(stride, groupSize)`` or ``(stride, groupSize, mode)``."""

    def __init__(self, *args, **kwargs):
        mode = kwargs.pop("retrievalMode_", kwargs.pop("retrievalMode", VariableRetrievalMode.OnePerGroup))
        domain = kwargs.pop("sharedVariableDomain_", kwargs.pop("sharedVariableDomain", None))
        ints = [a for a in args if isinstance(a, int) and not isinstance(a, VariableRetrievalMode)]
        for a in args:
            if isinstance(a, CommGroup):
                domain = a
            elif isinstance(a, VariableRetrievalMode):
                mode = a
        self._mode = VariableRetrievalMode(int(mode))
        if len(ints) >= 2:
            self._use_comm_group = False
            self._stride, self._group_size = int(ints[0]), int(ints[1])
            if self._group_size == 1:
                self._stride = 1
            self._domain = None
        else:
            self._use_comm_group = True
            self._domain = domain if domain is not None else CommGroup(CommGroupType.All, 0)
            self._stride, self._group_size = 0, int(self._domain.replicaGroupSize)

    # ------------------------------------------------------------------ PopART's accessors
    def isUsingCommGroup(self) -> bool:
        return self._use_comm_group

    def getSharedVariableDomain(self) -> CommGroup:
        return self._domain

    def getCommGroupType(self):
        return self._domain.type if self._use_comm_group else None

    def getRetrievalMode(self) -> VariableRetrievalMode:
        return self._mode

    def getGroupSize(self) -> int:
        return self._group_size

    def _type(self):
        return CommGroupType(int(self._domain.type))

    def _ungrouped(self) -> bool:
        return self._type() == CommGroupType.Ungrouped or self._domain.replicaGroupSize == 1

    def getGroupCount(self, replicaCount: int) -> int:
        if not self._use_comm_group:
            return replicaCount // self._group_size
        if self._ungrouped():
            return replicaCount
        if self._type() == CommGroupType.All:
            return 1
        return replicaCount // self._domain.replicaGroupSize

    def getRealGroupSize(self, replicaCount: int) -> int:
        if not self._use_comm_group:
            return self._group_size
        kind = self._type()
        if kind == CommGroupType.All:
            return replicaCount
        if kind == CommGroupType.Ungrouped:
            return 1
        return self._domain.replicaGroupSize

    def getStride(self, replicaCount: int) -> int:
        if not self._use_comm_group:
            return self._stride
        if self._type() == CommGroupType.Orthogonal:
            return replicaCount // self._domain.replicaGroupSize
        return 1

    def getGroupRepresentative(self, group: int) -> int:
        """The first replica of ``group``."""
        if not self._use_comm_group:
            return (group % self._stride) + (group // self._stride) * self._stride * self._group_size
        kind = self._type()
        if kind == CommGroupType.All:
            return 0
        if kind == CommGroupType.Consecutive:
            return self._domain.replicaGroupSize * group
        return group

    def numReplicasReturningVariable(self, replicaCount: int) -> int:
        if self._mode == VariableRetrievalMode.AllReplicas:
            return replicaCount
        return self.getGroupCount(replicaCount)

    def groups(self, replicaCount: int) -> list[list[int]]:
        """The replicas of each group."""
        count, size, stride = self.getGroupCount(replicaCount), self.getRealGroupSize(replicaCount), \
            self.getStride(replicaCount)
        return [[self.getGroupRepresentative(g) + i * stride for i in range(size)] for g in range(count)]

    def shapeOnReplica(self, full_shape, replicaCount: int, name: str = "") -> list[int]:
        """One replica's shape of a variable whose host value has ``full_shape`` (the group count leads)."""
        shape = list(full_shape)
        return shape if self.getGroupCount(replicaCount) == 1 else shape[1:]

    def shapeOnHost(self, replicaShape, replicaCount: int) -> list[int]:
        groups = self.getGroupCount(replicaCount)
        return list(replicaShape) if groups == 1 else [groups] + list(replicaShape)

    def verify(self) -> None:
        pass

    def __repr__(self):
        where = (f"{self._type().name}, {self._domain.replicaGroupSize}" if self._use_comm_group
                 else f"stride={self._stride}, groupSize={self._group_size}")
        return f"VariableSettings({where}, {self._mode.name})"
