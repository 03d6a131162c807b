"""What the soak watches while it loads the GPUs: SM clock, temperature, clock-throttle reasons and
XIDs. NVML (``pynvml`` from nvidia-ml-py, imported lazily) on CUDA; nothing on the CPU path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

# NVML clocks-throttle-reason bits that mean the hardware is protecting itself (not idle, not an
# application clock setting, not the ordinary power cap): nvml.h nvmlClocksThrottleReason*.
THROTTLE_BITS = {
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal_slowdown",
    0x0000000000000040: "hw_thermal_slowdown",
    0x0000000000000080: "hw_power_brake_slowdown",
}


def throttle_names(mask: int) -> tuple[str, ...]:
    """The protective throttle reasons set in an NVML reason ``mask``."""
    return tuple(name for bit, name in THROTTLE_BITS.items() if mask & bit)


@dataclass(frozen=True, slots=True)
class Sample:
    sm_clock_mhz: float | None
    temperature_c: float | None
    throttle: tuple[str, ...]


class Watcher(Protocol):
    """Reads GPU telemetry. Failures to read are logged and return empty samples, never raise: the
    soak's load is the measurement, telemetry only explains it."""

    def sample(self, gpu: int) -> Sample: ...

    def xids(self, gpu: int) -> list[int]:
        """XIDs reported for ``gpu`` since the last call."""
        ...

    def close(self) -> None: ...


class NullWatcher:
    """The CPU path: no telemetry."""

    def sample(self, gpu: int) -> Sample:
        return Sample(None, None, ())

    def xids(self, gpu: int) -> list[int]:
        return []

    def close(self) -> None:
        return None


class NvmlWatcher:
    """NVML telemetry for GPUs ``0..count-1`` (CUDA index order is assumed to match NVML's; set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for that)."""

    def __init__(self, count: int, nvml: Any = None) -> None:
        """``nvml``: the pynvml module (imported when None; tests pass a fake with the same API)."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml: Any = nvml
        nvml.nvmlInit()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        # Renamed in newer NVML ("clocks event reasons"); the old name stays as an alias.
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons: Any = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self._events: list[Any] = []
        for h in self._handles:
            es = nvml.nvmlEventSetCreate()
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, es)
            except nvml.NVMLError as err:
                log.warning("XID events unavailable on this GPU: %s", err)
            self._events.append(es)

    def sample(self, gpu: int) -> Sample:
        nv, h = self._nvml, self._handles[gpu]
        try:
            clock = float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            temp = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            mask = int(self._reasons(h))
        except nv.NVMLError as err:
            log.warning("gpu%d: NVML read failed: %s", gpu, err)
            return Sample(None, None, ())
        return Sample(clock, temp, throttle_names(mask))

    def xids(self, gpu: int) -> list[int]:
        nv = self._nvml
        out: list[int] = []
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(self._events[gpu], 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: no more events
                return out
            out.append(int(data.eventData))

    def close(self) -> None:
        nv = self._nvml
        for es in self._events:
            try:
                nv.nvmlEventSetFree(es)
            except nv.NVMLError as err:
                log.warning("NVML event set free failed: %s", err)
        nv.nvmlShutdown()


def watcher_for(cuda: bool, count: int) -> Watcher:
    """NVML on CUDA when nvidia-ml-py is installed and NVML starts; otherwise no telemetry."""
    if not cuda:
        return NullWatcher()
    try:
        return NvmlWatcher(count)
    except Exception as err:  # ImportError or NVMLError: telemetry is optional
        log.warning("soak runs without NVML telemetry (clocks, throttle, XIDs): %s", err)
        return NullWatcher()
