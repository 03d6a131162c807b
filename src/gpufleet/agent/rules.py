"""Passive checks: readings in, observations out, with thresholds from config.

The agent does not judge: each event names the rule that fired (``attrs.rule``) and the controller
judges it once with the site's catalog (``domain/data/rules_catalog.csv`` + the policy file's
overrides, ``domain/judgement.py``).

Every check is edge-triggered: it reports when a condition *starts* (a flag turns on, a counter grows
past its threshold within one interval, a rate crosses its limit) and re-arms when the condition clears,
so a GPU that stays hot yields one event, not one per second. Below the thresholds, error counters that
grow on a link are reported as informational weak link reports, at most one per link a minute
(:mod:`gpufleet.agent.weaklinks`): the correlator's evidence from coherence.

Each event's id is ``<node>:<key>@<time>`` (:func:`gpufleet.agent.eventids.event_id`): the key names the
rule, the component and what fired (a counter's total, a width), the time is the event's own, to the
microsecond. A counter's total alone would repeat: counters start again from 0 after a reset, an edge goes
off and on again, a rebooted node reports a condition that still holds (decision 0129). An agent restarted
on the same boot and hardware starts from the edges its last run stored (:meth:`PassiveChecks.restore_armed`,
decision 0132) and does not report again what still stands.

Components follow the fleet's slot names: ``<node>-gpu<i>``, ``<node>-nic<k>`` (k = the HCA's position
among the node's InfiniBand HCAs, in natural name order: mlx5_2 before mlx5_10), ``<node>`` for host checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet.agent.collectors.host import HostReading
from gpufleet.agent.collectors.infiniband import IbPortReading
from gpufleet.agent.devices.port import THERMAL_THROTTLE, FastReading, SlowReading, XidEvent
from gpufleet.agent.eventids import event_id
from gpufleet.agent.weaklinks import WeakLinks
from gpufleet.domain.events import IB_RCV_SEEN, IB_SYMBOL_SEEN, NVLINK_SEEN, EventKind, HealthEvent
from gpufleet.domain.fleet import gpu_slot, nic_slot

# Keys of ``PassiveChecks._active`` that remember a link seen up on this boot (what makes a later down a
# condition), not a condition themselves: NVLinks, InfiniBand ports.
_SEEN_UP = ("up:", "ib_up:")
# What :meth:`PassiveChecks.rearm` keeps after a repair that worked: the InfiniBand ports seen up (a GPU
# reset or a fabric-manager restart does not touch the HCA). Not the NVLinks: the reset tears them down
# and they train again, so a link read before it is back is not "down" (as after a reboot).
_KEPT_BY_REARM = (_SEEN_UP[1],)


@dataclass(frozen=True, slots=True)
class Thresholds:
    thermal_c: float = 87.0  # GPU core limit, C (rule gpu_thermal); H100 SXM slows down around 87-90 C
    thermal_clear_c: float = 82.0  # hysteresis: re-arm below this (at most thermal_c)
    hbm_thermal_c: float = 95.0  # HBM temperature limit, C (rule hbm_thermal)
    sbe_increase: int = 100  # new correctable ECC errors within one slow interval (rule sbe_burst)
    dbe_increase: int = 1  # new uncorrectable ECC errors (rule dbe_increase)
    retired_pages_max: int = 60  # retired pages reported at this count (pre-Ampere GPUs retire at most 64)
    pcie_replay_increase: int = 100  # new PCIe replays within one slow interval (rule pcie_replay)
    pcie_gen_min_util: float = 50.0  # PCIe gen is checked only above this GPU utilisation, %: idle GPUs downtrain
    nvlink_error_increase: int = 100  # NVLink CRC flit + data + replay + recovery errors within one interval
    ib_window_s: float = 60.0  # seconds over which InfiniBand error rates are measured
    ib_symbol_error_per_min: float = 10.0  # symbol errors per minute on a port (rule ib_symbol_error)
    ib_rcv_error_per_min: float = 10.0  # receive errors per minute on a port (rule ib_port_rcv_errors)
    ib_expected_rate_gbps: float | None = None  # e.g. 400 for NDR; None = no rate check
    edac_ue_increase: int = 1  # new uncorrectable host-memory (EDAC) errors (rule edac_ue)
    mount_min_free_fraction: float = 0.05  # a watched mount with less free space is reported (rule disk_free)
    # Every NVLink / InfiniBand error-counter increase below the rules above is reported as an informational
    # link_error (rules nvlink_error_seen, ib_*_seen: the correlator's weak witnesses; agent/weaklinks.py).
    weak_link_events: bool = True
    # at most one weak report per link in this many seconds; errors within it go into the next report
    weak_link_interval_s: float = 60.0


@dataclass(slots=True)
class _Rate:
    value: int
    t: float


@dataclass(slots=True)
class PassiveChecks:
    node: str
    thresholds: Thresholds = field(default_factory=Thresholds)
    ib_nic_index: dict[str, int] = field(default_factory=dict)
    _active: set[str] = field(default_factory=set)
    _last: dict[str, int] = field(default_factory=dict)
    _rates: dict[str, _Rate] = field(default_factory=dict)
    _xid_seq: int = 0
    _weak: WeakLinks | None = None
    _taken: frozenset[str] = frozenset()

    def _weak_count(self, key: str, errors: int, now: datetime) -> int | None:
        """The errors to send in a weak link report for ``key`` now (:class:`WeakLinks`), or None."""
        th = self.thresholds
        if not th.weak_link_events or errors <= 0:
            return None
        if self._weak is None:
            self._weak = WeakLinks(th.weak_link_interval_s)
        return self._weak.seen(key, errors, now.timestamp())

    # --- helpers ----------------------------------------------------------------------------
    def gpu(self, index: int) -> str:
        return gpu_slot(self.node, index)

    def nic(self, device: str) -> str:
        if device not in self.ib_nic_index:
            self.ib_nic_index[device] = len(self.ib_nic_index)
        return nic_slot(self.node, self.ib_nic_index[device])

    def _edge(self, key: str, cond: bool) -> bool:
        """True when ``cond`` turns on for ``key``; re-arms when it turns off."""
        if cond:
            if key in self._active:
                return False
            self._active.add(key)
            return True
        self._active.discard(key)
        return False

    # --- standing conditions across restarts (decision 0132) ------------------------------------
    def take_armed(self) -> frozenset[str] | None:
        """The conditions that stand now (each reported once when it turned on), when that set changed
        since the last call; None when it did not. The runner stores it with the tick's events (what
        was seen up, hot or down: every edge, whichever rule keeps it)."""
        if self._active == self._taken:
            return None
        self._taken = frozenset(self._active)
        return self._taken

    def restore_armed(self, keys: Iterable[str]) -> None:
        """Start with ``keys`` standing, as a previous run of the agent left them: a condition that still
        holds is not reported again (the controller has it); one that cleared meanwhile re-arms at its
        first reading."""
        self._taken = frozenset(keys)
        self._active = set(self._taken)

    def rearm(self) -> None:
        """A repair command worked: every condition is looked at afresh, so one that still stands is reported
        again (decision 0132). The InfiniBand ports *seen up* on this boot are kept: a port still down
        after a GPU reset is a condition that stands. NVLinks are forgotten: the reset retrains them, and
        one read before it is back must not be reported down. The stored set (:meth:`take_armed`) is left
        as it is, so the next tick stores the new one."""
        self._active = {k for k in self._active if k.startswith(_KEPT_BY_REARM)}

    def _delta(self, key: str, value: int | None) -> int:
        """Growth of a counter since its last reading (0 on the first reading or after a reset)."""
        if value is None:
            return 0
        prev = self._last.get(key)
        self._last[key] = value
        if prev is None or value < prev:
            return 0
        return value - prev

    def _event(
        self,
        key: str,
        kind: EventKind,
        now: datetime,
        component: str,
        rule: str,
        message: str,
        *,
        code: int | None = None,
        link: str | None = None,
        attrs: tuple[tuple[str, str], ...] = (),
        source: str = "agent",
    ) -> HealthEvent:
        """One observation at ``now``, its id made here once: ``key`` (what was seen) at ``now``
        (:func:`~gpufleet.agent.eventids.event_id`). ``rule`` names the rule that fired (the controller's
        catalog judges it: ``rules_catalog.csv``); ``attrs`` carry the local identities the controller
        maps to topology ids (``gpu`` index, ``device``/``port`` of an HCA, ``nvlink`` number)."""
        local: tuple[tuple[str, str], ...] = (("rule", rule),) if rule else ()
        gpu = component.removeprefix(f"{self.node}-gpu")
        if gpu != component and gpu.isdigit():
            local += (("gpu", gpu),)
        return HealthEvent(
            id=event_id(self.node, key, now),
            node=self.node,
            kind=kind,
            time=now,
            component=component,
            code=code,
            link=link,
            message=message,
            source=source,
            attrs=local + attrs,
        )

    # --- GPU --------------------------------------------------------------------------------
    def on_xid(self, x: XidEvent) -> HealthEvent:
        comp = self.gpu(x.index) if x.index >= 0 else self.node
        msg = f"NVML XID {x.code}" + (f": {x.detail}" if x.detail else "")
        self._xid_seq += 1  # two XIDs of one code and GPU in the same microsecond are still two events
        return self._event(
            f"xid:{comp}:{x.code}:{self._xid_seq}",
            EventKind.XID,
            x.time,
            comp,
            "",
            msg,
            code=x.code,
            source="nvml",
        )

    def on_fast(self, r: FastReading, now: datetime) -> list[HealthEvent]:
        out: list[HealthEvent] = []
        g, th = self.gpu(r.index), self.thresholds
        if self._edge(f"lost:{g}", r.lost):
            out.append(
                self._event(
                    f"gpu_lost:{g}",
                    EventKind.GPU_LOST,
                    now,
                    g,
                    "gpu_lost",
                    "GPU is lost (NVML GPU_IS_LOST): fell off the bus or stopped answering",
                )
            )
        if r.lost:
            return out
        temp = r.temp_gpu_c
        throttled = r.throttle_reasons is not None and bool(r.throttle_reasons & THERMAL_THROTTLE)
        hot_key = f"thermal:{g}"
        if temp is not None and hot_key in self._active and temp < th.thermal_clear_c and not throttled:
            self._active.discard(hot_key)
        hot = (temp is not None and temp >= th.thermal_c) or throttled
        if hot and hot_key not in self._active:
            self._active.add(hot_key)
            why = "thermal slowdown asserted" if throttled else f"temperature {temp:.0f} C >= {th.thermal_c:.0f} C"
            out.append(
                self._event(
                    f"thermal:{g}",
                    EventKind.THERMAL,
                    now,
                    g,
                    "gpu_thermal",
                    f"GPU thermal excursion: {why}",
                    attrs=(("temp_c", f"{temp}"), ("throttle", f"{r.throttle_reasons}")),
                )
            )
        hbm = r.temp_hbm_c
        if self._edge(f"hbm:{g}", hbm is not None and hbm >= th.hbm_thermal_c):
            out.append(
                self._event(
                    f"hbm_thermal:{g}",
                    EventKind.THERMAL,
                    now,
                    g,
                    "hbm_thermal",
                    f"HBM temperature {hbm:.0f} C >= {th.hbm_thermal_c:.0f} C",
                    attrs=(("sensor", "hbm"),),
                )
            )
        return out

    def on_slow(self, r: SlowReading, now: datetime, util: float | None = None) -> list[HealthEvent]:
        if r.lost:
            return []
        out: list[HealthEvent] = []
        g, th = self.gpu(r.index), self.thresholds
        d_dbe = self._delta(f"dbe:{g}", r.ecc_dbe_aggregate)
        if d_dbe >= th.dbe_increase:
            out.append(
                self._event(
                    f"ecc_dbe:{g}:{r.ecc_dbe_aggregate}",
                    EventKind.ECC_DBE,
                    now,
                    g,
                    "dbe_increase",
                    f"{d_dbe} new uncorrectable ECC errors (aggregate {r.ecc_dbe_aggregate})",
                )
            )
        d_sbe = self._delta(f"sbe:{g}", r.ecc_sbe_aggregate)
        if d_sbe >= th.sbe_increase:
            out.append(
                self._event(
                    f"ecc_sbe:{g}:{r.ecc_sbe_aggregate}",
                    EventKind.ECC_SBE,
                    now,
                    g,
                    "sbe_burst",
                    f"{d_sbe} new correctable ECC errors in one interval",
                )
            )
        rows = f"{r.remap_correctable}/{r.remap_uncorrectable}"
        if self._edge(f"remap_failure:{g}", bool(r.remap_failure)):
            out.append(
                self._event(
                    f"row_remap_failure:{g}:{rows}",
                    EventKind.ROW_REMAP_FAILURE,
                    now,
                    g,
                    "remap_failure",
                    "row remapping failed: the GPU has no spare rows left",
                )
            )
        if self._edge(f"remap_pending:{g}", bool(r.remap_pending)):
            out.append(
                self._event(
                    f"row_remap_pending:{g}:{rows}",
                    EventKind.ROW_REMAP_PENDING,
                    now,
                    g,
                    "remap_pending",
                    "row remap pending: takes effect at the next GPU reset",
                )
            )
        if self._edge(f"retired_pending:{g}", bool(r.retired_pages_pending)):
            out.append(
                self._event(
                    f"retired_pending:{g}:{r.retired_pages_sbe}/{r.retired_pages_dbe}",
                    EventKind.ROW_REMAP_PENDING,
                    now,
                    g,
                    "page_retirement_pending",
                    "page retirement pending: takes effect at the next GPU reset",
                    attrs=(("mechanism", "page_retirement"),),
                )
            )
        retired = (r.retired_pages_sbe or 0) + (r.retired_pages_dbe or 0)
        if self._edge(f"retired_max:{g}", retired >= th.retired_pages_max):
            out.append(
                self._event(
                    f"retired_max:{g}:{retired}",
                    EventKind.ECC_DBE,
                    now,
                    g,
                    "retired_pages_max",
                    f"{retired} retired pages (limit {th.retired_pages_max})",
                )
            )
        out += self._pcie(r, now, g, util)
        out += self._nvlink(r, now, g)
        return out

    def _pcie(self, r: SlowReading, now: datetime, g: str, util: float | None) -> list[HealthEvent]:
        out: list[HealthEvent] = []
        th, link = self.thresholds, f"{g}~pcie"
        narrow = r.pcie_width is not None and r.pcie_width_max is not None and r.pcie_width < r.pcie_width_max
        if self._edge(f"pcie_width:{g}", narrow):
            out.append(
                self._event(
                    f"pcie_width:{g}:x{r.pcie_width}",
                    EventKind.LINK_ERROR,
                    now,
                    g,
                    "pcie_width",
                    f"PCIe link width x{r.pcie_width} below max x{r.pcie_width_max}",
                    link=link,
                )
            )
        busy = util is not None and util >= th.pcie_gen_min_util
        slow = busy and r.pcie_gen is not None and r.pcie_gen_max is not None and r.pcie_gen < r.pcie_gen_max
        if self._edge(f"pcie_gen:{g}", slow):
            out.append(
                self._event(
                    f"pcie_gen:{g}:gen{r.pcie_gen}",
                    EventKind.LINK_ERROR,
                    now,
                    g,
                    "pcie_gen",
                    f"PCIe link gen {r.pcie_gen} below max gen {r.pcie_gen_max} under load",
                    link=link,
                )
            )
        d = self._delta(f"pcie_replay:{g}", r.pcie_replay)
        if d >= th.pcie_replay_increase:
            out.append(
                self._event(
                    f"pcie_replay:{g}:{r.pcie_replay}",
                    EventKind.LINK_ERROR,
                    now,
                    g,
                    "pcie_replay",
                    f"{d} PCIe replays in one interval",
                    link=link,
                )
            )
        return out

    def _nvlink(self, r: SlowReading, now: datetime, g: str) -> list[HealthEvent]:
        out: list[HealthEvent] = []
        for lk in r.nvlinks:
            key = f"{g}:nvlink{lk.link}"
            was_up = f"{_SEEN_UP[0]}{key}" in self._active
            if lk.up:
                self._active.add(f"{_SEEN_UP[0]}{key}")
            if self._edge(f"down:{key}", was_up and lk.up is False):
                out.append(
                    self._event(
                        f"nvlink_down:{key}",
                        EventKind.LINK_DOWN,
                        now,
                        g,
                        "nvlink_down",
                        f"NVLink {lk.link} went down",
                        link=f"{g}~nvlink{lk.link}",
                        attrs=(("nvlink", str(lk.link)),),
                    )
                )
            if lk.up:
                self._active.discard(f"down:{key}")
            total = sum(v or 0 for v in (lk.crc_flit, lk.crc_data, lk.replay, lk.recovery))
            d = self._delta(f"nvlink_err:{key}", total)
            if d >= self.thresholds.nvlink_error_increase:
                out.append(
                    self._event(
                        f"nvlink_err:{key}:{total}",
                        EventKind.LINK_ERROR,
                        now,
                        g,
                        "nvlink_errors",
                        f"{d} NVLink {lk.link} errors (CRC flit/data, replay, recovery) in one interval",
                        link=f"{g}~nvlink{lk.link}",
                        attrs=(("nvlink", str(lk.link)),),
                    )
                )
            elif (n := self._weak_count(f"nvlink:{key}", d, now)) is not None:
                out.append(
                    self._event(
                        f"nvlink_seen:{key}:{total}",
                        EventKind.LINK_ERROR,
                        now,
                        g,
                        NVLINK_SEEN,
                        f"{n} NVLink {lk.link} error(s) (CRC flit/data, replay, recovery) since the last report",
                        link=f"{g}~nvlink{lk.link}",
                        attrs=(("nvlink", str(lk.link)), ("errors", str(n))),
                    )
                )
        return out

    # --- InfiniBand -------------------------------------------------------------------------
    def on_ib(self, p: IbPortReading, now: datetime, mono: float) -> list[HealthEvent]:
        out: list[HealthEvent] = []
        nic, th = self.nic(p.device), self.thresholds
        key = f"{nic}:{p.port}"
        attrs = (("device", p.device), ("port", str(p.port)))
        seen_active = f"{_SEEN_UP[1]}{key}" in self._active
        if p.active:
            self._active.add(f"{_SEEN_UP[1]}{key}")
        if self._edge(f"ib_down:{key}", seen_active and not p.active and p.state != ""):
            out.append(
                self._event(
                    f"ib_down:{key}",
                    EventKind.LINK_DOWN,
                    now,
                    nic,
                    "ib_down",
                    f"InfiniBand {p.device} port {p.port} is {p.state} ({p.phys_state})",
                    attrs=attrs,
                )
            )
        if p.active:
            self._active.discard(f"ib_down:{key}")
        downed = p.counter("link_downed")
        d = self._delta(f"ib_downed:{key}", downed)
        if d > 0:
            out.append(
                self._event(
                    f"ib_flap:{key}:{downed}",
                    EventKind.LINK_FLAP,
                    now,
                    nic,
                    "ib_flap",
                    f"InfiniBand {p.device} port {p.port} went down and up {d} time(s)",
                    attrs=attrs,
                )
            )
        slow = (
            p.active
            and th.ib_expected_rate_gbps is not None
            and p.rate_gbps is not None
            and p.rate_gbps < th.ib_expected_rate_gbps
        )
        if self._edge(f"ib_rate:{key}", slow):
            out.append(
                self._event(
                    f"ib_rate:{key}",
                    EventKind.LINK_ERROR,
                    now,
                    nic,
                    "ib_rate",
                    f"InfiniBand {p.device} port {p.port} at {p.rate_gbps:g} Gb/s, expected "
                    f"{th.ib_expected_rate_gbps:g}",
                    attrs=attrs,
                )
            )
        for counter, limit, seen in (
            ("symbol_error", th.ib_symbol_error_per_min, IB_SYMBOL_SEEN),
            ("port_rcv_errors", th.ib_rcv_error_per_min, IB_RCV_SEEN),
        ):
            value = p.counter(counter)
            grew = self._delta(f"ib_{counter}_seen:{key}", value)
            rate = self._rate(f"{counter}:{key}", value, mono)
            edge = f"ib_{counter}:{key}"
            # Over the limit: at the last measured rate (one per ib_window_s; between two, the rule's state).
            over = rate > limit if rate is not None else edge in self._active
            if rate is None or not self._edge(edge, over):
                n = None if over else self._weak_count(f"ib_{counter}:{key}", grew, now)
                if n is not None:
                    out.append(
                        self._event(
                            f"{seen}:{key}:{value}",
                            EventKind.LINK_ERROR,
                            now,
                            nic,
                            seen,
                            f"InfiniBand {p.device} port {p.port}: {n} {counter} error(s) since the last report",
                            attrs=(*attrs, ("errors", str(n))),
                        )
                    )
                continue
            out.append(
                self._event(
                    f"ib_{counter}:{key}:{value}",
                    EventKind.LINK_ERROR,
                    now,
                    nic,
                    f"ib_{counter}",
                    f"InfiniBand {p.device} port {p.port}: {counter} at {rate:.1f}/min (limit {limit:g}/min)",
                    attrs=(*attrs, ("per_min", f"{rate:.1f}")),
                )
            )
        return out

    def _rate(self, key: str, value: int | None, mono: float) -> float | None:
        """Per-minute growth of a counter over a window of ``ib_window_s``; None until a window closes."""
        if value is None:
            return None
        base = self._rates.get(key)
        if base is None or value < base.value:
            self._rates[key] = _Rate(value, mono)
            return None
        elapsed = mono - base.t
        if elapsed < self.thresholds.ib_window_s:
            return None
        self._rates[key] = _Rate(value, mono)
        return (value - base.value) / elapsed * 60.0

    # --- host -------------------------------------------------------------------------------
    def on_host(self, h: HostReading, now: datetime) -> list[HealthEvent]:
        out: list[HealthEvent] = []
        th = self.thresholds
        for mc in h.edac:
            d = self._delta(f"edac_ue:{mc.mc}", mc.uncorrectable)
            if d >= th.edac_ue_increase:
                out.append(
                    self._event(
                        f"edac_ue:{mc.mc}:{mc.uncorrectable}",
                        EventKind.CHECK_FAILED,
                        now,
                        self.node,
                        "edac_ue",
                        f"host memory controller {mc.mc}: {d} new uncorrectable errors",
                        attrs=(("check", "edac"), ("mc", mc.mc)),
                    )
                )
        for m in h.mounts:
            if self._edge(f"mount_missing:{m.role}", not m.present):
                out.append(
                    self._event(
                        f"mount_missing:{m.role}",
                        EventKind.CHECK_FAILED,
                        now,
                        self.node,
                        "mount_missing",
                        f"{m.role} mount {m.path} is missing",
                        attrs=(("check", "mount"), ("mount", m.path)),
                    )
                )
            frac = m.free_fraction
            if self._edge(f"mount_full:{m.role}", frac is not None and frac < th.mount_min_free_fraction):
                out.append(
                    self._event(
                        f"mount_full:{m.role}",
                        EventKind.CHECK_FAILED,
                        now,
                        self.node,
                        "disk_free",
                        f"{m.role} mount {m.path} has {100 * (frac or 0):.1f}% free "
                        f"(minimum {100 * th.mount_min_free_fraction:.0f}%)",
                        attrs=(("check", "disk_free"), ("mount", m.path)),
                    )
                )
        return out
