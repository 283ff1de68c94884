"""``IPUAccelerator``: Lightning's ``accelerator="ipu"``, backed by openpop's virtual IPUs.

A virtual IPU is a slot in openpop's execution plan, mapped onto a real ``torch.device``
(the CPU here; CUDA GPUs where openpop's device map puts them). For Lightning, ``devices`` is the
*replication factor*: how many data-parallel replicas of the model one host call runs. It must
be a power of two, as on IPU systems. A model split into blocks over ``k`` IPUs uses
``k * devices`` virtual IPUs in total, as on real hardware.
"""
from typing import Any

import torch

from ._framework import pl

DEVICE_TYPE = "ipu"
# What Lightning 2.0's ``accelerators/ipu.py`` exported as ``_POPTORCH_AVAILABLE`` and
# ``_IPU_AVAILABLE`` (scripts branch on them): openpop's ``poptorch`` is always importable, and
# virtual IPUs run wherever torch runs. (``poptorch.ipuHardwareIsAvailable()`` still answers
# whether Graphcore hardware is present: it is not.)
POPTORCH_AVAILABLE = True
IPU_AVAILABLE = True
AUTO_DEVICE_COUNT = 4  # IPUs shipped in units of four; `devices="auto"` means 4 replicas, as before

DEVICES_NOT_INT = ("`Trainer(accelerator='ipu', devices={devices!r})`: `devices` is the number of model replicas "
                   "and must be an int (a power of two: 1, 2, 4, 8, ...), not {kind}.")
DEVICES_NOT_POW2 = ("`Trainer(accelerator='ipu', devices={devices!r})`: `devices` is the number of model replicas "
                    "and must be a power of two (1, 2, 4, 8, ...). Use devices={lower} or devices={upper}.")


def parse_replicas(devices: Any) -> int:
    """``devices`` as an int power of two, else ``ValueError`` naming the fix."""
    value = devices
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(DEVICES_NOT_INT.format(devices=devices, kind=type(devices).__name__))
    if value < 1 or value & (value - 1):
        lower = 1 << max(value.bit_length() - 1, 0) if value > 0 else 1
        raise ValueError(DEVICES_NOT_POW2.format(devices=devices, lower=lower, upper=max(lower * 2, 2)))
    return value


def virtual_ipus(count: int) -> list[torch.device]:
    return [torch.device(DEVICE_TYPE, index) for index in range(count)]


class IPUAccelerator(pl.accelerators.Accelerator):
    """Lightning's ``accelerator="ipu"``: openpop's virtual IPUs on the host's CPU or GPUs.

    ``devices`` is the number of replicas (a power of two; ``"auto"`` is 4); each replica's
    virtual IPUs map onto torch devices through the device map (``OPENPOP_DEVICE_MAP``).
    """

    def setup_device(self, device: torch.device) -> None:
        pass

    def get_device_stats(self, device) -> dict[str, Any]:
        return {}

    def teardown(self) -> None:
        pass

    @staticmethod
    def parse_devices(devices: Any) -> int:
        return parse_replicas(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return virtual_ipus(parse_replicas(devices))

    @staticmethod
    def auto_device_count() -> int:
        return AUTO_DEVICE_COUNT

    @staticmethod
    def is_available() -> bool:
        return IPU_AVAILABLE

    @staticmethod
    def name() -> str:
        return DEVICE_TYPE

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(DEVICE_TYPE, cls, description="openpop virtual IPUs (CPU/GPU)",
                                      override=True)
