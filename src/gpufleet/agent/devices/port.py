"""The GPU device port: what the agent reads from a GPU, whatever library sits underneath.

Two implementations pass one contract suite (tests/contract/test_device_contract.py): ``nvml`` (the real
NVIDIA Management Library through ``nvidia-ml-py``) and ``sim`` (N simulated GPUs with injectable faults).

Failure behaviour (the part of the contract that matters most on a sick node):

* ``open()`` never raises for a missing driver, a missing library or a failed init: it returns a
  :class:`DeviceStatus` with ``ok=False`` and a message an operator can act on. The agent keeps running
  (InfiniBand, kernel log and host collectors do not need NVML) and exports ``gpufleet_agent_device_up 0``.
* A field the GPU does not support (``NOT_SUPPORTED``, ``NO_PERMISSION``...) reads as ``None``; the reason is
  in ``Reading.errors``. It is data, never an exception.
* A GPU that falls off the bus (``GPU_IS_LOST``), including in the middle of a read, gives a reading with
  ``lost=True``; the fields read before the loss are kept. Every later read of that GPU says lost too.
* ``wait_xids(timeout_s)`` blocks for at most ``timeout_s`` and returns the XID events seen since the last
  call (possibly none). The runner uses it as its sleep, so XIDs are picked up as they happen.

Readings are plain frozen dataclasses, created once per GPU per read (no large per-tick allocations).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import IntFlag
from typing import Protocol


class ThrottleReason(IntFlag):
    """NVML ``nvmlClocksEventReasons`` bits (nvml.h, ``nvmlClocksEventReason*``)."""

    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100


THERMAL_THROTTLE = ThrottleReason.SW_THERMAL_SLOWDOWN | ThrottleReason.HW_THERMAL_SLOWDOWN


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    ok: bool
    message: str  # "3 GPUs, driver 550.54.15" or "no NVIDIA driver: NVML Shared Library Not Found"
    driver_version: str = ""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str  # model name, e.g. "NVIDIA H100 80GB HBM3"
    pci_bus_id: str  # normalised dddd:bb:dd.f (lower case)
    nvlinks: int = 0  # number of NVLinks the device reports (0 on PCIe cards)
    serial: str = ""  # board serial (names the physical unit; "" when the GPU does not report one)
    nvlink_peers: tuple[str, ...] = ()  # per NVLink: the PCI address of the device at its other end ("" unknown)


@dataclass(frozen=True, slots=True)
class FastReading:
    """The cheap fields, read every ``fast_interval`` (1 s by default). ``None`` = not available."""

    index: int
    lost: bool = False
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_gpu_c: float | None = None
    temp_hbm_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: int | None = None  # ThrottleReason bitmask
    errors: tuple[str, ...] = ()  # "temp_hbm: Not Supported"


@dataclass(frozen=True, slots=True)
class NvLinkReading:
    link: int
    up: bool | None
    crc_flit: int | None = None
    crc_data: int | None = None
    replay: int | None = None
    recovery: int | None = None


@dataclass(frozen=True, slots=True)
class SlowReading:
    """The expensive fields, read every ``slow_interval`` (30 s by default). ``None`` = not available."""

    index: int
    lost: bool = False
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replay: int | None = None
    nvlinks: tuple[NvLinkReading, ...] = ()
    errors: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class XidEvent:
    index: int  # GPU index
    code: int
    time: datetime
    detail: str = ""


class Device(Protocol):
    """A node's GPUs. See the module docstring for the failure contract every implementation keeps."""

    name: str  # "nvml" or "sim"

    def open(self) -> DeviceStatus:
        """Initialise the library and enumerate GPUs. Never raises for a missing driver or library."""
        ...

    def gpus(self) -> tuple[GpuInfo, ...]:
        """The GPUs found by ``open()`` (empty before, or when it failed)."""
        ...

    def read_fast(self, index: int) -> FastReading: ...

    def read_slow(self, index: int) -> SlowReading: ...

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        """Block at most ``timeout_s`` seconds; return the XID events that arrived (oldest first)."""
        ...

    def close(self) -> None: ...
