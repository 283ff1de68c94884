"""``popart.DeviceManager``: openpop's virtual IPUs presented as PopART devices.

Every device kind (CPU, IPU model, offline IPU, "real" IPUs from ``acquireAvailableDevice``)
runs on the same runtime: virtual IPU ``i`` of replica ``r`` lands on entry ``r*ipus + i`` of
openpop's device map (CUDA GPUs round-robin, else the CPU; ``OPENPOP_DEVICE_MAP``). The pool
holds ``OPENPOP_POPART_NUM_IPUS`` (default 64) IPUs, so scripts that enumerate or acquire
IPUs find them. ``SyncPattern`` and connection types are accepted and change nothing here.
"""
from typing import Optional

from .. import openpop_settings
from . import messages
from .enums import DeviceConnectionType, DeviceSelectionCriterion, DeviceType, SyncPattern
from .errors import popart_exception

DEFAULT_TILES = 1472


def pool_size() -> int:
    return openpop_settings.read("popart_num_ipus")


class DeviceInfo:
    def __init__(self, device_id: int, num_ipus: int, device_type: DeviceType, tiles: int = DEFAULT_TILES,
                 options: Optional[dict] = None, connection=DeviceConnectionType.Always, pattern=SyncPattern.Full):
        self._id = device_id
        self._num_ipus = int(num_ipus)
        self._type = device_type
        self._tiles = int(tiles) if tiles else DEFAULT_TILES
        self._options = dict(options or {})
        self._connection = DeviceConnectionType(int(connection))
        self._pattern = SyncPattern(int(pattern))
        self._attached = device_type in (DeviceType.Cpu, DeviceType.IpuModel, DeviceType.Sim) or \
            (device_type == DeviceType.Ipu and self._connection == DeviceConnectionType.Always)

    @property
    def id(self) -> int:
        return self._id

    @property
    def numIpus(self) -> int:
        return self._num_ipus

    @property
    def tilesPerIPU(self) -> int:
        return self._tiles

    @property
    def type(self) -> DeviceType:
        return self._type

    @property
    def connectionType(self) -> DeviceConnectionType:
        return self._connection

    @property
    def isAttached(self) -> bool:
        return self._attached

    @property
    def version(self) -> str:
        return self._options.get("ipuVersion", "ipu2")

    @property
    def driverIds(self) -> list[int]:
        return [self._id]

    def attach(self) -> bool:
        if self._type == DeviceType.OfflineIpu:
            raise popart_exception(messages.ATTACH_OFFLINE_DEVICE)
        self._attached = True
        return True

    def tryAttachUntilTimeout(self) -> bool:
        return self.attach()

    def detach(self) -> None:
        self._attached = False

    def getNumIpus(self) -> int:
        return self._num_ipus

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()
        return False

    def __repr__(self):
        return f"Device Type:{self._type.name} Connection Type:{self._connection.name} Id:{self._id} " \
               f"Version:{self.version} NumIPUs:{self._num_ipus} NumTilesPerIPU:{self._tiles}"

    __str__ = __repr__


def _ipus_from(options: dict, key="numIPUs", default=1) -> int:
    value = options.get(key, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise popart_exception(messages.INVALID_DEVICE_OPTION.format(value=value, key=key)) from None


class DeviceManager:
    """A singleton, as PopART's binding."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
            cls._instance._acquired = {}
            cls._instance._timeout = 0
        return cls._instance

    def createCpuDevice(self) -> DeviceInfo:
        return DeviceInfo(0, 1, DeviceType.Cpu, 1)

    def createIpuModelDevice(self, options: Optional[dict] = None) -> DeviceInfo:
        options = {k: str(v) for k, v in (options or {}).items()}
        return DeviceInfo(0, _ipus_from(options), DeviceType.IpuModel,
                          _ipus_from(options, "tilesPerIPU", DEFAULT_TILES), options)

    def createSimDevice(self, options: Optional[dict] = None) -> DeviceInfo:
        options = {k: str(v) for k, v in (options or {}).items()}
        return DeviceInfo(0, _ipus_from(options), DeviceType.Sim, _ipus_from(options, "tilesPerIPU", DEFAULT_TILES),
                          options)

    def createOfflineIPUDevice(self, options: Optional[dict] = None) -> DeviceInfo:
        options = {k: str(v) for k, v in (options or {}).items()}
        return DeviceInfo(0, _ipus_from(options), DeviceType.OfflineIpu,
                          _ipus_from(options, "tilesPerIPU", DEFAULT_TILES), options)

    def createOfflineIpuFromDeviceInfo(self, deviceInfo: DeviceInfo) -> DeviceInfo:
        return DeviceInfo(deviceInfo.id, deviceInfo.numIpus, DeviceType.OfflineIpu, deviceInfo.tilesPerIPU)

    def _device_ids(self, num_ipus: int) -> list[int]:
        """PopART's numbering: single IPUs 0..N-1, then groups of 2, 4, 8, ... aligned."""
        n = pool_size()
        ids, base, size = [], 0, 1
        while size <= n:
            for start in range(0, n, size):
                if size == num_ipus and start + size <= n:
                    ids.append(base + start // size)
            base += n // size
            size *= 2
        return ids

    def enumerateDevices(self, pattern=SyncPattern.Full, numIpus: int = 1, deviceType=DeviceType.Ipu,
                         connectionType=DeviceConnectionType.Always, tilesPerIPU: int = 0) -> list[DeviceInfo]:
        return [DeviceInfo(i, numIpus, DeviceType.Ipu, tilesPerIPU, connection=connectionType, pattern=pattern)
                for i in self._device_ids(int(numIpus))]

    def _acquire(self, numIpus, tilesPerIpu, pattern, connectionType, strict):
        numIpus = int(numIpus)
        if numIpus < 1 or numIpus > pool_size() or numIpus & (numIpus - 1):
            if strict:
                raise popart_exception(messages.NOT_ENOUGH_IPUS.format(
                    numIpus=numIpus, pool_size=pool_size()))
            return None
        for device_id in self._device_ids(numIpus):
            if device_id not in self._acquired:
                device = DeviceInfo(device_id, numIpus, DeviceType.Ipu, tilesPerIpu, connection=connectionType,
                                    pattern=pattern)
                self._acquired[device_id] = device
                _release_on_detach(self, device)
                return device
        if strict:
            raise popart_exception(messages.ALL_DEVICES_ATTACHED.format(numIpus=numIpus))
        return None

    def acquireAvailableDevice(self, numIpus: int = 1, tilesPerIpu: int = 0, pattern=SyncPattern.Full,
                               connectionType=DeviceConnectionType.Always,
                               selectionCriterion=DeviceSelectionCriterion.First) -> DeviceInfo:
        return self._acquire(numIpus, tilesPerIpu, pattern, connectionType, strict=True)

    def tryAcquireAvailableDevice(self, numIpus: int = 1, tilesPerIpu: int = 0, pattern=SyncPattern.Full,
                                  connectionType=DeviceConnectionType.Always,
                                  selectionCriterion=DeviceSelectionCriterion.First) -> Optional[DeviceInfo]:
        return self._acquire(numIpus, tilesPerIpu, pattern, connectionType, strict=False)

    def acquireDeviceById(self, id: int, pattern=SyncPattern.Full,
                          connectionType=DeviceConnectionType.Always) -> DeviceInfo:
        return self._by_id(id, pattern, connectionType, strict=True)

    def tryAcquireDeviceById(self, id: int, pattern=SyncPattern.Full,
                             connectionType=DeviceConnectionType.Always) -> Optional[DeviceInfo]:
        return self._by_id(id, pattern, connectionType, strict=False)

    def _by_id(self, device_id, pattern, connectionType, strict):
        n = pool_size()
        base, size = 0, 1
        while size <= n:
            count = n // size
            if base <= device_id < base + count:
                if device_id in self._acquired:
                    if strict:
                        raise popart_exception(messages.DEVICE_ID_ATTACHED.format(device_id=device_id))
                    return None
                device = DeviceInfo(device_id, size, DeviceType.Ipu, 0, connection=connectionType, pattern=pattern)
                self._acquired[device_id] = device
                _release_on_detach(self, device)
                return device
            base += count
            size *= 2
        if strict:
            raise popart_exception(messages.NO_SUCH_DEVICE_ID.format(device_id=device_id))
        return None

    def setOnDemandAttachTimeout(self, seconds: int) -> None:
        self._timeout = int(seconds)


def _release_on_detach(manager: DeviceManager, device: DeviceInfo) -> None:
    detach = device.detach

    def released():
        detach()
        manager._acquired.pop(device.id, None)
    device.detach = released
