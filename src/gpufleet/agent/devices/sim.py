"""A simulated node: N GPUs with realistic H100-SXM values and injectable faults.

The values follow what ``nvidia-smi -q`` shows on an HGX H100 board: 81559 MiB of HBM3, 700 W power
limit, SM clock up to 1980 MHz, memory clock 2619 MHz, PCIe gen 5 x16 (downtrained to gen 1 while idle,
as real boards do to save power), 18 NVLinks. Utilisation follows a seeded random walk; temperature and
power follow utilisation.

Faults (each a method on :class:`SimDevice`): XIDs, SBE/DBE growth (a DBE also records a pending
uncorrectable row remap, as Ampere and later GPUs do), row-remap pending and failure, thermal excursions
with clock throttling, PCIe width/gen degradation, NVLink down and CRC errors, a GPU falling off the bus
(XID 79, every later read says lost), and fields that read NOT_SUPPORTED.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from gpufleet.agent.clock import AgentClock, SystemClock
from gpufleet.agent.devices.port import (
    DeviceStatus,
    FastReading,
    GpuInfo,
    NvLinkReading,
    SlowReading,
    ThrottleReason,
    XidEvent,
)
from gpufleet.agent.devices.simhost import SimKernelLog
from gpufleet.domain.errors import InvalidInput

H100_MEM_TOTAL = 81559 * 1024 * 1024
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_NVLINKS = 18
# An HGX H100 board's four NVSwitch chips (as the simulator places them): NVLink n of every GPU lands on
# chip n % 4, so the inventory's NVLink peers look like a real board's.
_NVSWITCH_BUSES = ("05", "06", "07", "08")


def nvswitch_pci(link: int) -> str:
    """The simulated PCI address of the NVSwitch at the other end of NVLink ``link``."""
    return f"0000:{_NVSWITCH_BUSES[link % len(_NVSWITCH_BUSES)]}:00.0"
_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


@dataclass(slots=True)
class SimLink:
    peer: str = ""  # the PCI address of the NVSwitch at the other end
    up: bool = True
    crc_flit: int = 0
    crc_data: int = 0
    replay: int = 0
    recovery: int = 0


@dataclass(slots=True)
class SimGpu:
    """The mutable state of one simulated GPU (shared with the NVML test double)."""

    index: int
    uuid: str
    pci_bus_id: str
    name: str = H100_NAME
    serial: str = ""
    util: float = 0.0
    load: float = 0.0  # the level the random walk is pulled towards (0..100)
    temp_gpu: float = 32.0
    temp_hbm: float = 36.0
    thermal_override: float | None = None
    lost: bool = False
    ecc_sbe_vol: int = 0
    ecc_dbe_vol: int = 0
    ecc_sbe_agg: int = 0
    ecc_dbe_agg: int = 0
    retired_sbe: int = 0
    retired_dbe: int = 0
    retired_pending: bool = False
    remap_corr: int = 0
    remap_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    pcie_gen_cap: int = 5  # a degraded link trains at most this
    pcie_width: int = 16
    pcie_replay: int = 0
    links: list[SimLink] = field(default_factory=lambda: [SimLink(nvswitch_pci(n)) for n in range(H100_NVLINKS)])
    unsupported: set[str] = field(default_factory=set)

    def step(self, rng: random.Random) -> None:
        """Advance the random walk one sample."""
        self.util += (self.load - self.util) * 0.2 + rng.gauss(0.0, 3.0)
        self.util = min(100.0, max(0.0, self.util))
        target = 30.0 + 0.38 * self.util
        self.temp_gpu += (target - self.temp_gpu) * 0.1 + rng.gauss(0.0, 0.2)
        self.temp_hbm = self.temp_gpu + 4.0 + 0.05 * self.util

    @property
    def thermal(self) -> bool:
        return self.thermal_override is not None

    @property
    def temperature(self) -> float:
        return self.thermal_override if self.thermal_override is not None else self.temp_gpu

    @property
    def power_w(self) -> float:
        return 69.0 + 6.2 * self.util * (0.6 if self.thermal else 1.0)

    @property
    def sm_clock(self) -> int:
        if self.thermal:
            return 1050
        return 1980 if self.util >= 1.0 else 345

    @property
    def mem_clock(self) -> int:
        return 2619

    @property
    def throttle(self) -> int:
        bits = ThrottleReason(0)
        if self.util < 1.0:
            bits |= ThrottleReason.GPU_IDLE
        if self.thermal:
            bits |= ThrottleReason.SW_THERMAL_SLOWDOWN | ThrottleReason.HW_THERMAL_SLOWDOWN
        return int(bits)

    @property
    def pcie_gen(self) -> int:
        return min(self.pcie_gen_cap, 5 if self.util >= 1.0 else 1)

    @property
    def mem_used(self) -> int:
        return int(H100_MEM_TOTAL * min(0.97, 0.005 + self.load / 100.0 * 0.9))


class SimDevice:
    """``N`` simulated GPUs behind the device port."""

    name = "sim"

    def __init__(
        self,
        gpus: int = 8,
        *,
        seed: int = 0,
        clock: AgentClock | None = None,
        load: float = 60.0,
        node_serial: int = 0,
        serials: Sequence[str] | None = None,
        kernel_log: SimKernelLog | None = None,
        absent: Collection[int] = (),
    ) -> None:
        """``serials`` names the GPUs' physical units (default ``SIM<seed>-<node_serial>-<i>``); when given,
        each GPU's UUID derives from its serial too, so a unit moved to another simulated node keeps both.
        With ``kernel_log``, the simulated driver also prints its XID and fallen-off-the-bus lines there.
        ``absent``: slots (0 .. ``gpus`` - 1) whose GPU does not enumerate, as after a reboot without it:
        the GPUs after it keep their PCI addresses and serials and are numbered one lower, as NVML does."""
        if gpus < 0:
            raise InvalidInput("gpus", gpus, "a GPU count of 0 or more")
        for slot in absent:
            if not 0 <= slot < gpus:
                raise InvalidInput("sim_absent", f"gpu{slot}", f"a GPU slot gpu0 .. gpu{gpus - 1}")
        if serials is not None and len(serials) != gpus:
            raise InvalidInput("serials", list(serials), f"{gpus} GPU serials, one per GPU")
        if not 0.0 <= load <= 100.0:
            raise InvalidInput("load", load, "a utilisation between 0 and 100")
        self._rng = random.Random(seed)
        self._clock: AgentClock = clock or SystemClock()
        self.state: list[SimGpu] = [
            SimGpu(
                index=i,
                uuid=_uuid(serials[i]) if serials else f"GPU-{seed:08x}-{node_serial:04x}-4000-8000-{i:012x}",
                serial=serials[i] if serials else f"SIM{seed}-{node_serial}-{i}",
                pci_bus_id=f"0000:{_BUSES[i] if i < len(_BUSES) else f'{0x10 + i:02x}'}:00.0",
                load=min(100.0, max(0.0, load + self._rng.uniform(-8.0, 8.0))) if load else 0.0,
                util=load,
                ecc_sbe_agg=self._rng.randint(0, 3),
            )
            for i in range(gpus)
        ]
        self.state = [g for g in self.state if g.index not in absent]
        for k, g in enumerate(self.state):
            g.index = k
        self.kernel_log = kernel_log
        self._xids: list[XidEvent] = []
        self._xid_lock = threading.Lock()  # faults may be injected from another thread
        self._opened = False

    # --- the port ---------------------------------------------------------------------------
    def open(self) -> DeviceStatus:
        self._opened = True
        return DeviceStatus(True, f"{len(self.state)} simulated GPUs ({H100_NAME})", "sim")

    def gpus(self) -> tuple[GpuInfo, ...]:
        if not self._opened:
            return ()
        return tuple(GpuInfo(g.index, g.uuid, g.name, g.pci_bus_id, len(g.links), g.serial,
                             tuple(lk.peer for lk in g.links)) for g in self.state)

    def read_fast(self, index: int) -> FastReading:
        g = self._gpu(index)
        if g.lost:
            return FastReading(index=index, lost=True, errors=("gpu: GPU is lost",))
        g.step(self._rng)
        u = g.unsupported
        errors = tuple(f"{f}: Not Supported" for f in sorted(u & _FAST_FIELDS))
        return FastReading(
            index=index,
            util_gpu_pct=None if "util" in u else round(g.util, 1),
            util_mem_pct=None if "util" in u else round(g.util * 0.55, 1),
            mem_used_bytes=g.mem_used,
            mem_total_bytes=H100_MEM_TOTAL,
            temp_gpu_c=None if "temp_gpu" in u else round(g.temperature, 1),
            temp_hbm_c=None if "temp_hbm" in u else round(g.temp_hbm if not g.thermal else g.temperature + 3, 1),
            power_w=None if "power" in u else round(g.power_w, 1),
            sm_clock_mhz=g.sm_clock,
            mem_clock_mhz=g.mem_clock,
            throttle_reasons=g.throttle,
            errors=errors,
        )

    def read_slow(self, index: int) -> SlowReading:
        g = self._gpu(index)
        if g.lost:
            return SlowReading(index=index, lost=True, errors=("gpu: GPU is lost",))
        u = g.unsupported
        nvl = (
            ()
            if "nvlink" in u
            else tuple(
                NvLinkReading(i, lk.up, lk.crc_flit, lk.crc_data, lk.replay, lk.recovery)
                for i, lk in enumerate(g.links)
            )
        )
        ecc = "ecc" not in u
        return SlowReading(
            index=index,
            ecc_sbe_volatile=g.ecc_sbe_vol if ecc else None,
            ecc_dbe_volatile=g.ecc_dbe_vol if ecc else None,
            ecc_sbe_aggregate=g.ecc_sbe_agg if ecc else None,
            ecc_dbe_aggregate=g.ecc_dbe_agg if ecc else None,
            retired_pages_sbe=None if "retired_pages" in u else g.retired_sbe,
            retired_pages_dbe=None if "retired_pages" in u else g.retired_dbe,
            retired_pages_pending=None if "retired_pages" in u else g.retired_pending,
            remap_correctable=None if "remap" in u else g.remap_corr,
            remap_uncorrectable=None if "remap" in u else g.remap_unc,
            remap_pending=None if "remap" in u else g.remap_pending,
            remap_failure=None if "remap" in u else g.remap_failure,
            pcie_gen=g.pcie_gen,
            pcie_gen_max=g.pcie_gen_max,
            pcie_width=g.pcie_width,
            pcie_width_max=g.pcie_width_max,
            pcie_replay=g.pcie_replay,
            nvlinks=nvl,
            errors=tuple(f"{f}: Not Supported" for f in sorted(u & _SLOW_FIELDS)),
        )

    def wait_xids(self, timeout_s: float) -> list[XidEvent]:
        if not self._xids:
            self._clock.sleep(timeout_s)
        with self._xid_lock:
            out, self._xids = self._xids, []
        return out

    def close(self) -> None:
        self._opened = False

    # --- repairs (the agent's repair commands on a simulated node: agent/commands.py) ------
    def reset(self) -> list[int]:
        """A simulated GPU reset (``nvidia-smi -r``) or reboot: what a reset clears is cleared — a lost
        GPU is back, volatile ECC counters are zero, a pending row remap is applied, a held (injected)
        temperature ends, PCIe retrains at full width and speed, NVLinks come up. What survives a
        reset on real hardware survives here: aggregate counters, retired pages, a row-remap failure.
        Returns the indices of the GPUs that had a fault cleared."""
        cleared = []
        for g in self.state:
            faulty = (g.lost or g.remap_pending or g.thermal_override is not None or g.pcie_width < g.pcie_width_max
                      or g.pcie_gen_cap < g.pcie_gen_max or any(not lk.up for lk in g.links))
            g.lost, g.remap_pending, g.thermal_override = False, False, None
            g.ecc_sbe_vol = g.ecc_dbe_vol = 0
            g.pcie_width, g.pcie_gen_cap = g.pcie_width_max, g.pcie_gen_max
            for lk in g.links:
                lk.up = True
            if faulty:
                cleared.append(g.index)
        with self._xid_lock:
            self._xids = []
        return cleared

    # --- faults -----------------------------------------------------------------------------
    def inject_xid(self, index: int, code: int, detail: str = "") -> None:
        """An XID as NVML reports it (and as the driver prints it to the kernel log, when there is one)."""
        g = self._gpu(index)
        with self._xid_lock:
            self._xids.append(XidEvent(index, code, self._clock.now(), detail))
        if self.kernel_log is not None:
            self.kernel_log.xid(g.pci_bus_id, code, detail)

    def add_ecc(self, index: int, *, sbe: int = 0, dbe: int = 0) -> None:
        """Grow the ECC counters; each uncorrectable error also records a pending row remap."""
        g = self._gpu(index)
        g.ecc_sbe_vol += sbe
        g.ecc_sbe_agg += sbe
        g.ecc_dbe_vol += dbe
        g.ecc_dbe_agg += dbe
        if dbe:
            g.remap_unc += dbe
            g.remap_pending = True

    def set_row_remap(self, index: int, *, pending: bool | None = None, failure: bool | None = None) -> None:
        g = self._gpu(index)
        if pending is not None:
            g.remap_pending = pending
        if failure is not None:
            g.remap_failure = failure

    def retire_pages(self, index: int, *, sbe: int = 0, dbe: int = 0, pending: bool = True) -> None:
        g = self._gpu(index)
        g.retired_sbe += sbe
        g.retired_dbe += dbe
        g.retired_pending = pending

    def thermal_excursion(self, index: int, temp_c: float = 94.0) -> None:
        """Hold the GPU at ``temp_c`` with thermal slowdown asserted and the SM clock cut."""
        self._gpu(index).thermal_override = temp_c

    def end_thermal_excursion(self, index: int) -> None:
        self._gpu(index).thermal_override = None

    def degrade_pcie(self, index: int, *, width: int | None = None, gen: int | None = None) -> None:
        g = self._gpu(index)
        if width is not None:
            g.pcie_width = width
        if gen is not None:
            g.pcie_gen_cap = gen

    def add_pcie_replays(self, index: int, count: int) -> None:
        self._gpu(index).pcie_replay += count

    def nvlink_down(self, index: int, link: int, down: bool = True) -> None:
        self._link(index, link).up = not down

    def add_nvlink_errors(
        self,
        index: int,
        link: int,
        *,
        crc_flit: int = 0,
        crc_data: int = 0,
        replay: int = 0,
        recovery: int = 0,
    ) -> None:
        lk = self._link(index, link)
        lk.crc_flit += crc_flit
        lk.crc_data += crc_data
        lk.replay += replay
        lk.recovery += recovery

    def fall_off_bus(self, index: int) -> None:
        """XID 79: the GPU is gone until the node is reset."""
        self.inject_xid(index, 79, "GPU has fallen off the bus.")
        g = self._gpu(index)
        g.lost = True
        if self.kernel_log is not None:
            self.kernel_log.fell_off_bus(g.pci_bus_id)

    def set_unsupported(self, index: int, *fields: str) -> None:
        unknown = set(fields) - _FAST_FIELDS - _SLOW_FIELDS
        if unknown:
            raise InvalidInput("fields", sorted(unknown), f"names from {sorted(_FAST_FIELDS | _SLOW_FIELDS)}")
        self._gpu(index).unsupported.update(fields)

    def set_load(self, index: int, load: float) -> None:
        self._gpu(index).load = load

    def pop_xid(self) -> XidEvent | None:
        """The oldest pending XID (used by the NVML test double's event set)."""
        with self._xid_lock:
            return self._xids.pop(0) if self._xids else None

    # --- helpers ----------------------------------------------------------------------------
    def _gpu(self, index: int) -> SimGpu:
        if not 0 <= index < len(self.state):
            raise InvalidInput("gpu index", index, f"an index between 0 and {len(self.state) - 1}")
        return self.state[index]

    def _link(self, index: int, link: int) -> SimLink:
        g = self._gpu(index)
        if not 0 <= link < len(g.links):
            raise InvalidInput("nvlink", link, f"a link between 0 and {len(g.links) - 1}")
        return g.links[link]


def _uuid(serial: str) -> str:
    h = hashlib.sha1(serial.encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"


_FAST_FIELDS = frozenset({"util", "temp_gpu", "temp_hbm", "power"})
_SLOW_FIELDS = frozenset({"ecc", "retired_pages", "remap", "nvlink"})
