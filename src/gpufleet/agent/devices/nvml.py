"""The NVML implementation of the device port, through ``nvidia-ml-py`` (module ``pynvml``).

Only this module imports pynvml. Every NVML call goes through :meth:`NvmlDevice._call`, which turns an
``NVMLError`` into data: ``NOT_SUPPORTED`` (and any other per-field error) becomes ``None`` plus a line in
``errors``; ``GPU_IS_LOST`` marks the GPU lost for good. A field that said NOT_SUPPORTED once is not asked
again (an unsupported field stays unsupported until the driver reloads), which keeps the 1 s tick cheap.

``lib`` is injectable: tests pass a double with pynvml's function surface that raises pynvml's own
error classes (tests/unit/agent/fake_nvml.py), so the error paths run without a GPU.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from gpufleet.agent.clock import AgentClock, SystemClock
from gpufleet.agent.devices.port import (
    DeviceStatus,
    FastReading,
    GpuInfo,
    NvLinkReading,
    SlowReading,
    XidEvent,
)
from gpufleet.domain.errors import InvalidInput

log = logging.getLogger(__name__)
_R = TypeVar("_R")

_NOT_SUPPORTED = 3
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_DRIVER_NOT_LOADED = 9
_GPU_IS_LOST = 15
_FUNCTION_NOT_FOUND = 13
_LOST_CODES = frozenset({_GPU_IS_LOST})
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError


class _Lost(Exception):
    """Internal: the GPU answered GPU_IS_LOST; the read stops and reports ``lost=True``."""


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def normalise_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as the kernel's ``0000:18:00.0`` (lower case)."""
    s = bus_id.strip().lower()
    dom, _, rest = s.partition(":")
    if rest and len(dom) > 4:
        dom = dom[-4:]
    return f"{dom}:{rest}" if rest else s


def _handle_key(handle: object) -> object:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return handle


class NvmlDevice:
    """The node's GPUs through NVML."""

    name = "nvml"

    def __init__(self, lib: Any | None = None, *, clock: AgentClock | None = None) -> None:
        self._lib_arg = lib
        self._lib: Any = None
        self._clock: AgentClock = clock or SystemClock()
        self._handles: list[object] = []
        self._infos: tuple[GpuInfo, ...] = ()
        self._lost: set[int] = set()
        self._unsupported: list[set[str]] = []
        self._events: object | None = None
        self._index_of: dict[object, int] = {}
        self._errors: list[str] = []

    # --- lifecycle --------------------------------------------------------------------------
    def open(self) -> DeviceStatus:
        try:
            lib = self._lib_arg if self._lib_arg is not None else importlib.import_module("pynvml")
        except ImportError:
            return DeviceStatus(False, "NVML unavailable: nvidia-ml-py is not installed (pip install 'gpufleet[nvml]')")
        self._lib = lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as err:
            code = getattr(err, "value", None)
            if code in (_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED):
                msg = f"no NVIDIA driver on this node (NVML: {err}); GPU telemetry is off"
            else:
                msg = f"NVML init failed (NVML: {err}); GPU telemetry is off"
            self._lib = None  # nothing to shut down
            return DeviceStatus(False, msg)
        driver = ""
        try:
            driver = _text(lib.nvmlSystemGetDriverVersion())
            count = int(lib.nvmlDeviceGetCount())
        except lib.NVMLError as err:
            return DeviceStatus(False, f"NVML could not count GPUs (NVML: {err})", driver)
        infos: list[GpuInfo] = []
        for i in range(count):
            infos.append(self._open_gpu(i))
        self._infos = tuple(infos)
        self._open_events()
        lost = f", {len(self._lost)} lost" if self._lost else ""
        return DeviceStatus(True, f"{count} GPUs, driver {driver}{lost}", driver)

    def _open_gpu(self, i: int) -> GpuInfo:
        lib = self._lib
        self._unsupported.append(set())
        try:
            h = lib.nvmlDeviceGetHandleByIndex(i)
        except lib.NVMLError as err:
            log.error("gpu%d: no NVML handle (%s); reporting it lost", i, err)
            self._handles.append(None)
            self._lost.add(i)
            return GpuInfo(i, "", "", "")
        self._handles.append(h)
        self._index_of[_handle_key(h)] = i
        try:
            uuid = _text(lib.nvmlDeviceGetUUID(h))
            name = _text(lib.nvmlDeviceGetName(h))
            bus = normalise_bus_id(_text(lib.nvmlDeviceGetPciInfo(h).busId))
        except lib.NVMLError as err:
            log.error("gpu%d: identity unreadable (%s); reporting it lost", i, err)
            self._lost.add(i)
            return GpuInfo(i, "", "", "")
        links, peers = 0, []
        for link in range(int(getattr(lib, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                lib.nvmlDeviceGetNvLinkState(h, link)
            except lib.NVMLError:
                break
            links += 1
            try:  # the NVSwitch (or peer GPU) at the link's other end, where NVML exposes it
                peers.append(normalise_bus_id(_text(lib.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)))
            except lib.NVMLError:
                peers.append("")
        try:
            serial = _text(lib.nvmlDeviceGetSerial(h)).strip()
        except lib.NVMLError as err:  # NOT_SUPPORTED on boards without one (GeForce): the slot still maps
            log.info("gpu%d: no board serial (%s)", i, err)
            serial = ""
        return GpuInfo(i, uuid, name, bus, links, serial, tuple(peers) if any(peers) else ())

    def _open_events(self) -> None:
        lib = self._lib
        try:
            es = lib.nvmlEventSetCreate()
        except lib.NVMLError as err:
            log.warning("NVML event set unavailable (%s): XIDs come from the kernel log only", err)
            return
        registered = 0
        for i, h in enumerate(self._handles):
            if h is None:
                continue
            try:
                lib.nvmlDeviceRegisterEvents(h, _XID_EVENT, es)
                registered += 1
            except lib.NVMLError as err:
                log.warning("gpu%d: XID events unavailable (%s)", i, err)
        self._events = es if registered else None

    def close(self) -> None:
        lib = self._lib
        if lib is None:
            return
        try:
            if self._events is not None:
                lib.nvmlEventSetFree(self._events)
            lib.nvmlShutdown()
        except lib.NVMLError as err:
            log.warning("NVML shutdown: %s", err)
        self._lib, self._events = None, None

    def gpus(self) -> tuple[GpuInfo, ...]:
        return self._infos

    # --- reads ------------------------------------------------------------------------------
    def _call(self, index: int, fieldname: str, fn: Callable[..., Any], *args: object) -> Any:
        if fieldname in self._unsupported[index]:
            return None
        try:
            return fn(self._handles[index], *args)
        except self._lib.NVMLError as err:
            code = getattr(err, "value", None)
            if code in _LOST_CODES:
                raise _Lost from err
            if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                self._unsupported[index].add(fieldname)
            self._errors.append(f"{fieldname}: {err}")
            return None

    def _begin(self, index: int) -> bool:
        if not 0 <= index < len(self._handles):
            raise InvalidInput("gpu index", index, f"an index between 0 and {len(self._handles) - 1}")
        self._errors = [f"{f}: Not Supported" for f in sorted(self._unsupported[index])]
        return index not in self._lost

    def read_fast(self, index: int) -> FastReading:
        if not self._begin(index):
            return FastReading(index=index, lost=True, errors=("gpu: GPU is lost",))
        lib = self._lib
        vals: dict[str, Any] = {}
        try:
            util = self._call(index, "util", lib.nvmlDeviceGetUtilizationRates)
            if util is not None:
                vals["util_gpu_pct"], vals["util_mem_pct"] = float(util.gpu), float(util.memory)
            mem = self._call(index, "memory", lib.nvmlDeviceGetMemoryInfo)
            if mem is not None:
                vals["mem_used_bytes"], vals["mem_total_bytes"] = int(mem.used), int(mem.total)
            t = self._call(index, "temp_gpu", lib.nvmlDeviceGetTemperature, lib.NVML_TEMPERATURE_GPU)
            vals["temp_gpu_c"] = None if t is None else float(t)
            vals["temp_hbm_c"] = self._hbm_temp(index)
            p = self._call(index, "power", lib.nvmlDeviceGetPowerUsage)
            vals["power_w"] = None if p is None else p / 1000.0
            vals["sm_clock_mhz"] = self._call(index, "sm_clock", lib.nvmlDeviceGetClockInfo, lib.NVML_CLOCK_SM)
            vals["mem_clock_mhz"] = self._call(index, "mem_clock", lib.nvmlDeviceGetClockInfo, lib.NVML_CLOCK_MEM)
            reasons_fn = (
                getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or lib.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            vals["throttle_reasons"] = self._call(index, "throttle", reasons_fn)
        except _Lost:
            return self._lost_now(index, FastReading(index=index, lost=True, errors=self._err("gpu"), **vals))
        return FastReading(index=index, errors=tuple(self._errors), **vals)

    def _hbm_temp(self, index: int) -> float | None:
        lib = self._lib
        values = self._call(index, "temp_hbm", lib.nvmlDeviceGetFieldValues, [lib.NVML_FI_DEV_MEMORY_TEMP])
        if values is None:
            return None
        v = values[0]
        ret = int(getattr(v, "nvmlReturn", 0))
        if ret == _GPU_IS_LOST:
            raise _Lost
        if ret != 0:
            if ret == _NOT_SUPPORTED:
                self._unsupported[index].add("temp_hbm")
            self._errors.append(f"temp_hbm: {self._lib.NVMLError(ret)}")
            return None
        return float(v.value.uiVal)

    def read_slow(self, index: int) -> SlowReading:
        if not self._begin(index):
            return SlowReading(index=index, lost=True, errors=("gpu: GPU is lost",))
        lib = self._lib
        vals: dict[str, Any] = {}
        try:
            ecc = lib.nvmlDeviceGetTotalEccErrors
            corr, unc = lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            vol, agg = lib.NVML_VOLATILE_ECC, lib.NVML_AGGREGATE_ECC
            vals["ecc_sbe_volatile"] = self._call(index, "ecc", ecc, corr, vol)
            vals["ecc_dbe_volatile"] = self._call(index, "ecc", ecc, unc, vol)
            vals["ecc_sbe_aggregate"] = self._call(index, "ecc", ecc, corr, agg)
            vals["ecc_dbe_aggregate"] = self._call(index, "ecc", ecc, unc, agg)
            pages = lib.nvmlDeviceGetRetiredPages
            sbe = self._call(
                index, "retired_pages", pages, lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            )
            dbe = self._call(index, "retired_pages", pages, lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
            vals["retired_pages_sbe"] = None if sbe is None else len(sbe)
            vals["retired_pages_dbe"] = None if dbe is None else len(dbe)
            pend = self._call(index, "retired_pages", lib.nvmlDeviceGetRetiredPagesPendingStatus)
            vals["retired_pages_pending"] = None if pend is None else bool(pend)
            rows = self._call(index, "remap", lib.nvmlDeviceGetRemappedRows)
            if rows is not None:
                c, u, p, f = rows[:4]
                vals.update(
                    remap_correctable=int(c),
                    remap_uncorrectable=int(u),
                    remap_pending=bool(p),
                    remap_failure=bool(f),
                )
            vals["pcie_gen"] = self._call(index, "pcie", lib.nvmlDeviceGetCurrPcieLinkGeneration)
            vals["pcie_gen_max"] = self._call(index, "pcie", lib.nvmlDeviceGetMaxPcieLinkGeneration)
            vals["pcie_width"] = self._call(index, "pcie", lib.nvmlDeviceGetCurrPcieLinkWidth)
            vals["pcie_width_max"] = self._call(index, "pcie", lib.nvmlDeviceGetMaxPcieLinkWidth)
            vals["pcie_replay"] = self._call(index, "pcie_replay", lib.nvmlDeviceGetPcieReplayCounter)
            vals["nvlinks"] = self._nvlinks(index)
        except _Lost:
            return self._lost_now(index, SlowReading(index=index, lost=True, errors=self._err("gpu"), **vals))
        return SlowReading(index=index, errors=tuple(self._errors), **vals)

    def _nvlinks(self, index: int) -> tuple[NvLinkReading, ...]:
        lib = self._lib
        n = self._infos[index].nvlinks if index < len(self._infos) else 0
        out: list[NvLinkReading] = []
        state, errs = lib.nvmlDeviceGetNvLinkState, lib.nvmlDeviceGetNvLinkErrorCounter
        for link in range(n):
            up = self._call(index, f"nvlink{link}", state, link)
            out.append(
                NvLinkReading(
                    link=link,
                    up=None if up is None else up == lib.NVML_FEATURE_ENABLED,
                    crc_flit=self._call(index, f"nvlink{link}_errors", errs, link, lib.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                    crc_data=self._call(index, f"nvlink{link}_errors", errs, link, lib.NVML_NVLINK_ERROR_DL_CRC_DATA),
                    replay=self._call(index, f"nvlink{link}_errors", errs, link, lib.NVML_NVLINK_ERROR_DL_REPLAY),
                    recovery=self._call(index, f"nvlink{link}_errors", errs, link, lib.NVML_NVLINK_ERROR_DL_RECOVERY),
                )
            )
        return tuple(out)

    def _err(self, what: str) -> tuple[str, ...]:
        return (*self._errors, f"{what}: GPU is lost")

    def _lost_now(self, index: int, reading: _R) -> _R:
        if index not in self._lost:
            log.error("gpu%d: GPU is lost (fell off the bus?); every later read reports it lost", index)
            self._lost.add(index)
        return reading

    # --- XID events -------------------------------------------------------------------------
    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        lib, es = self._lib, self._events
        if lib is None or es is None:
            self._clock.sleep(timeout_s)
            return []
        out: list[XidEvent] = []
        wait_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = lib.nvmlEventSetWait_v2(es, wait_ms)
            except lib.NVMLError as err:
                if getattr(err, "value", None) != _TIMEOUT:
                    log.warning("NVML event wait: %s", err)
                    if not out:
                        self._clock.sleep(timeout_s)
                return out
            index = self._index_of.get(_handle_key(data.device), -1)
            if int(data.eventType) & _XID_EVENT:
                out.append(XidEvent(index, int(data.eventData), self._clock.now()))
            wait_ms = 0  # drain what is queued, then return
