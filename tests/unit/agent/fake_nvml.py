"""A test double with pynvml's function surface, backed by a :class:`SimDevice`'s GPU state.

It raises pynvml's *own* error classes (``pynvml.NVMLError(code)`` picks the subclass), so the NVML
adapter's error handling runs exactly as it would against the real library. Faults are injected on the
SimDevice (shared state); NVML-level failures with :meth:`FakeNvml.fail` and :meth:`FakeNvml.lose_after`.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml

from gpufleet.agent.devices.sim import H100_MEM_TOTAL, SimDevice, SimGpu

_BASE = 1000  # handles are ints; 0 would read as a NULL pointer


class FakeNvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, sim: SimDevice, *, driver: str = "550.54.15", init_error: int | None = None) -> None:
        self.sim = sim
        self.driver = driver
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self._fail: dict[tuple[int | None, str], int] = {}
        self._lose_after: dict[int, int] = {}
        self._gpu_calls: dict[int, int] = {}
        self.initialised = False

    def __getattr__(self, name: str) -> Any:  # constants: NVML_*, nvmlEventType*
        if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    # --- fault injection --------------------------------------------------------------------
    def fail(self, fn: str, code: int, index: int | None = None) -> None:
        """Make ``fn`` raise NVMLError(code) (for one GPU or all)."""
        self._fail[(index, fn)] = code

    def lose_after(self, index: int, calls: int) -> None:
        """GPU ``index`` answers ``calls`` more calls, then GPU_IS_LOST for good (lost mid-poll)."""
        self._lose_after[index] = self._gpu_calls.get(index, 0) + calls

    # --- plumbing ---------------------------------------------------------------------------
    def _enter(self, fn: str, handle: int | None = None) -> SimGpu | None:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if not self.initialised and fn != "nvmlInit":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if handle is None:
            code = self._fail.get((None, fn))
            if code is not None:
                raise pynvml.NVMLError(code)
            return None
        index = int(handle) - _BASE
        g = self.sim.state[index]
        n = self._gpu_calls[index] = self._gpu_calls.get(index, 0) + 1
        limit = self._lose_after.get(index)
        if g.lost or (limit is not None and n > limit):
            g.lost = True
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        code = self._fail.get((index, fn), self._fail.get((None, fn)))
        if code is not None:
            raise pynvml.NVMLError(code)
        return g

    def _unsupported(self, g: SimGpu, name: str) -> None:
        if name in g.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # --- library ----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.sim.state)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._enter("nvmlDeviceGetHandleByIndex")
        if self.sim.state[index].lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        code = self._fail.get((index, "nvmlDeviceGetHandleByIndex"))
        if code is not None:
            raise pynvml.NVMLError(code)
        return _BASE + index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        g = self._enter("nvmlDeviceGetUUID", h)
        assert g is not None
        return g.uuid

    def nvmlDeviceGetSerial(self, h: int) -> str:
        g = self._enter("nvmlDeviceGetSerial", h)
        assert g is not None
        if not g.serial:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.serial

    def nvmlDeviceGetName(self, h: int) -> str:
        g = self._enter("nvmlDeviceGetName", h)
        assert g is not None
        return g.name

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        g = self._enter("nvmlDeviceGetPciInfo", h)
        assert g is not None
        return SimpleNamespace(busId=("0000" + g.pci_bus_id).upper().encode())  # NVML: 00000000:18:00.0

    # --- fast fields ------------------------------------------------------------------------
    def _g(self, fn: str, h: int, field: str | None = None) -> SimGpu:
        g = self._enter(fn, h)
        assert g is not None
        if field:
            self._unsupported(g, field)
        return g

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        g = self._g("nvmlDeviceGetUtilizationRates", h, "util")
        g.step(self.sim._rng)
        return SimpleNamespace(gpu=round(g.util), memory=round(g.util * 0.55))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self._g("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(used=g.mem_used, total=H100_MEM_TOTAL, free=H100_MEM_TOTAL - g.mem_used)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        g = self._g("nvmlDeviceGetTemperature", h, "temp_gpu")
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return round(g.temperature)

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[SimpleNamespace]:
        g = self._g("nvmlDeviceGetFieldValues", h)
        out = []
        for fid in ids:
            assert fid == pynvml.NVML_FI_DEV_MEMORY_TEMP
            ret = pynvml.NVML_ERROR_NOT_SUPPORTED if "temp_hbm" in g.unsupported else 0
            temp = g.temperature + 3 if g.thermal else g.temp_hbm
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=ret, value=SimpleNamespace(uiVal=round(temp))))
        return out

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return round(self._g("nvmlDeviceGetPowerUsage", h, "power").power_w * 1000)

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        g = self._g("nvmlDeviceGetClockInfo", h)
        return g.sm_clock if clock == pynvml.NVML_CLOCK_SM else g.mem_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._g("nvmlDeviceGetCurrentClocksEventReasons", h).throttle

    # --- slow fields ------------------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(self, h: int, etype: int, counter: int) -> int:
        g = self._g("nvmlDeviceGetTotalEccErrors", h, "ecc")
        corrected = etype == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if counter == pynvml.NVML_VOLATILE_ECC:
            return g.ecc_sbe_vol if corrected else g.ecc_dbe_vol
        return g.ecc_sbe_agg if corrected else g.ecc_dbe_agg

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        g = self._g("nvmlDeviceGetRetiredPages", h, "retired_pages")
        n = (
            g.retired_sbe
            if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            else g.retired_dbe
        )
        return [0x1000 * (i + 1) for i in range(n)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return int(self._g("nvmlDeviceGetRetiredPagesPendingStatus", h, "retired_pages").retired_pending)

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        g = self._g("nvmlDeviceGetRemappedRows", h, "remap")
        return (g.remap_corr, g.remap_unc, int(g.remap_pending), int(g.remap_failure))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._g("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._g("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._g("nvmlDeviceGetCurrPcieLinkWidth", h).pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._g("nvmlDeviceGetMaxPcieLinkWidth", h).pcie_width_max

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return self._g("nvmlDeviceGetPcieReplayCounter", h).pcie_replay

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        g = self._g("nvmlDeviceGetNvLinkState", h, "nvlink")
        if link >= len(g.links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if g.links[link].up else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> SimpleNamespace:
        g = self._g("nvmlDeviceGetNvLinkRemotePciInfo", h, "nvlink")
        if link >= len(g.links) or not g.links[link].peer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(busId=g.links[link].peer.upper().encode())

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        g = self._g("nvmlDeviceGetNvLinkErrorCounter", h, "nvlink")
        lk = g.links[link]
        return {
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: lk.crc_flit,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: lk.crc_data,
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: lk.replay,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: lk.recovery,
        }[counter]

    # --- events -----------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> str:
        self._enter("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: int, types: int, es: str) -> None:
        self._g("nvmlDeviceRegisterEvents", h)
        assert types & pynvml.nvmlEventTypeXidCriticalError and es == "event-set"

    def nvmlEventSetFree(self, es: str) -> None:
        self._enter("nvmlEventSetFree")

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        x = self.sim.pop_xid()
        if x is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(
            device=_BASE + x.index,
            eventType=pynvml.nvmlEventTypeXidCriticalError,
            eventData=x.code,
            gpuInstanceId=0,
            computeInstanceId=0,
        )


def nvml_over_sim(gpus: int = 4, seed: int = 7, **kw: Any) -> tuple[Any, SimDevice, FakeNvml]:
    """(NvmlDevice on a FakeNvml, the SimDevice holding the state, the fake library)."""
    from gpufleet.agent.clock import FakeClock
    from gpufleet.agent.devices.nvml import NvmlDevice

    clock = kw.pop("clock", None) or FakeClock()
    sim = SimDevice(gpus, seed=seed, clock=clock)
    sim.open()
    lib = FakeNvml(sim, **kw)
    return NvmlDevice(lib, clock=clock), sim, lib


Factory = Callable[[], tuple[Any, SimDevice]]
