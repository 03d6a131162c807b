"""The agent's main loop: collect at each cadence, check, export, spool.

One thread does all collection. It never sleeps on its own: between ticks it waits inside
``device.wait_xids(timeout)`` (NVML's event-set wait, or the clock's sleep for the simulator), so an
XID is handled the moment it arrives and the loop costs nothing while idle. Pushing runs on its own
thread (:class:`~gpufleet.agent.push.Pusher`), woken by an event when something was spooled; the HTTP
exporter has its own thread too. Nothing busy-waits.

An unexpected exception in one collector is logged (first time, then every 100th), counted in
``gpufleet_agent_collector_errors`` and the loop goes on: one broken sensor never stops the agent.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from gpufleet.agent.clock import AgentClock
from gpufleet.agent.collectors.host import HostCollector
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.collectors.kmsg import KernelLog
from gpufleet.agent.devices.port import Device, DeviceStatus, XidEvent
from gpufleet.agent.idlegpu import MIB, IdleGpus
from gpufleet.agent.rules import PassiveChecks
from gpufleet.agent.spool import Spool
from gpufleet.agent.telemetry import Telemetry
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import HealthEvent

log = logging.getLogger(__name__)
_T = TypeVar("_T")
_PCI = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass(frozen=True, slots=True)
class Cadence:
    fast_s: float = 1.0  # GPU cheap fields, XIDs, kernel log
    slow_s: float = 30.0  # GPU ECC / remap / PCIe / NVLink
    ib_s: float = 1.0  # InfiniBand sysfs (cheap reads)
    host_s: float = 30.0  # EDAC, mounts

    def __post_init__(self) -> None:
        for name in ("fast_s", "slow_s", "ib_s", "host_s"):
            v = getattr(self, name)
            if not v > 0:
                raise InvalidInput(f"cadence.{name}", v, "a positive number of seconds")


class Agent:
    def __init__(
        self,
        node: str,
        device: Device,
        clock: AgentClock,
        *,
        checks: PassiveChecks | None = None,
        telemetry: Telemetry | None = None,
        cadence: Cadence | None = None,
        ib: InfinibandCollector | None = None,
        host: HostCollector | None = None,
        kmsg: KernelLog | None = None,
        spool: Spool | None = None,
        on_events: Callable[[Sequence[HealthEvent]], None] | None = None,
        wake_pusher: threading.Event | None = None,
        inject: Callable[[], object] | None = None,
        idle: IdleGpus | None = None,
        boot_id: Callable[[], str] | None = None,
    ) -> None:
        self.node = node
        self.device = device
        self.clock = clock
        self.checks = checks or PassiveChecks(node)
        self.telemetry = telemetry or Telemetry(hostname=node)
        self.cadence = cadence or Cadence()
        self.ib, self.host, self.kmsg = ib, host, kmsg
        self.spool = spool
        self.on_events = on_events
        self.wake_pusher = wake_pusher
        self.inject = inject  # simulated faults that are due (agent/devices/faults.py), run after each tick
        self.idle = idle  # allocated-but-idle GPUs (agent/idlegpu.py), looked at on the slow tick
        self.status = DeviceStatus(False, "not opened")
        self._next = {"fast": 0.0, "slow": 0.0, "ib": 0.0, "host": 0.0}
        self._indices: range = range(0)
        self._pci: dict[int, str] = {}  # GPU index -> PCI address
        self._gpu_of: dict[str, int] = {}  # PCI address -> GPU index
        self._restored = False  # the spool's edges, taken at the first tick (decision 0132)
        self.boot_id = boot_id  # the kernel's boot id (commands.boot_id_reader); None: nothing is kept
        self._rearm = threading.Event()  # a repair worked: every condition is looked at afresh

    # --- lifecycle --------------------------------------------------------------------------
    def open(self) -> DeviceStatus:
        t = self.telemetry
        t.device = self.device.name
        try:
            self.status = self.device.open()
        except Exception as err:  # the port says open() never raises; a bug in an implementation must not crash
            log.exception("device %s failed to open", self.device.name)
            self.status = DeviceStatus(False, f"device {self.device.name} failed to open: {err}")
        t.device_up, t.device_message, t.driver_version = (
            self.status.ok,
            self.status.message,
            self.status.driver_version,
        )
        (log.info if self.status.ok else log.warning)(
            "%s: device %s: %s", self.node, self.device.name, self.status.message
        )
        t.set_gpus(self.device.gpus() if self.status.ok else ())
        self._indices = range(len(t.gpus))
        self._pci = {g.index: g.pci_bus_id for g in t.gpus if g.pci_bus_id}
        self._gpu_of = {pci: i for i, pci in self._pci.items()}
        if self.kmsg is not None:
            t.kmsg_source = self._guard("kmsg", self.kmsg.start) or "none"
            log.info("%s: kernel log source: %s", self.node, t.kmsg_source)
        mono = self.clock.monotonic()
        self._next = dict.fromkeys(self._next, mono)
        return self.status

    def close(self) -> None:
        if self.kmsg is not None:
            self._guard("kmsg", self.kmsg.close)
        self._guard("device", self.device.close)

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set. Waits for XIDs between ticks (no busy loop)."""
        while not stop.is_set():
            self.tick()
            wait = max(0.0, self.next_due() - self.clock.monotonic())
            xids = self._guard("xid", self.device.wait_xids, wait) if self.status.ok else None
            if xids is None:  # no device, or its wait failed: sleep here instead (never spin)
                self.clock.sleep(min(wait, self.cadence.fast_s))
            elif xids:
                self._xids(xids)

    def next_due(self) -> float:
        due = [self._next["fast"], self._next["slow"]]
        if self.ib is not None:
            due.append(self._next["ib"])
        if self.host is not None:
            due.append(self._next["host"])
        return min(due)

    # --- one tick ---------------------------------------------------------------------------
    def tick(self) -> list[HealthEvent]:
        """Run every collector that is due; returns the health events raised (already emitted)."""
        mono, now = self.clock.monotonic(), self.clock.now()
        events: list[HealthEvent] = []
        t = self.telemetry
        t.ticks += 1
        if not self._restored:
            self._restore_edges()
        if self._rearm.is_set():
            self._rearm.clear()
            self.checks.rearm()
        if self._due("fast", mono, self.cadence.fast_s):
            if self.status.ok:
                for i in self._indices:
                    r = self._guard("gpu_fast", self.device.read_fast, i)
                    if r is not None:
                        t.fast[i] = r
                        events += self._local(self.checks.on_fast(r, now), "nvml", i)
            if self.kmsg is not None:
                events += self._local(self._guard("kmsg", self.kmsg.poll) or [])
                t.kmsg_lines = self.kmsg.lines
                t.kmsg_undecoded = self.kmsg.decoder.undecoded
        if self._due("slow", mono, self.cadence.slow_s) and self.status.ok:
            for i in self._indices:
                r2 = self._guard("gpu_slow", self.device.read_slow, i)
                if r2 is not None:
                    t.slow[i] = r2
                    fast = t.fast[i]
                    found = self.checks.on_slow(r2, now, None if fast is None else fast.util_gpu_pct)
                    events += self._local(found, "nvml", i)
            if self.idle is not None:
                util = {i: (f.util_gpu_pct if (f := t.fast[i]) is not None else None) for i in self._indices}
                mem = {i: (f.mem_used_bytes / MIB if (f := t.fast[i]) is not None and f.mem_used_bytes is not None
                           else None) for i in self._indices}
                for e in self._guard("idle_gpu", self.idle.observe, now, util, None, mem) or []:
                    events += self._local([e], "nvml", int(e.attr("gpu")))  # pci named as for every GPU event
                t.idle_gpu = self.idle.idle_seconds(now)
                t.idle_gpu_user = dict(self.idle.owners)
        if self.ib is not None and self._due("ib", mono, self.cadence.ib_s):
            ports = self._guard("infiniband", self.ib.read)
            if ports is not None:
                t.ib = ports
                for p in ports:
                    events += self._local(self.checks.on_ib(p, now, mono), "infiniband")
        if self.host is not None and self._due("host", mono, self.cadence.host_s):
            h = self._guard("host", self.host.read)
            if h is not None:
                t.host = h
                events += self._local(self.checks.on_host(h, now), "host")
        armed = self.checks.take_armed()  # stored with the events that changed it (decision 0132)
        if events:
            self.emit(events, armed)
        elif armed is not None and self.spool is not None:
            self.spool.put((), armed)
        if self.inject is not None:
            self._guard("inject", self.inject)
        return events

    def rearm(self) -> None:
        """A repair command worked (``commands.CommandPoller.on_repaired``): from the next tick every
        condition is looked at afresh, so one that still stands is reported again and the controller
        learns that the repair did not fix it (decision 0132). Thread-safe."""
        self._rearm.set()

    def _scope(self) -> str:
        """What kept edges are valid for: this boot and this hardware. A reboot (the repair ladder's own,
        or people's after a repair) looks at everything afresh (ports still training at boot are not
        "down": they were never seen up in this boot), as do a GPU board, an HCA port or a mount that
        changed while the agent was stopped. "" (no boot id) keeps nothing."""
        boot = self.boot_id() if self.boot_id is not None else ""
        if not boot:
            return ""
        gpus = ",".join(g.uuid for g in self.telemetry.gpus)
        mounts = ",".join(f"{r}={p}" for r, p in sorted(self.host.mounts.items())) if self.host is not None else ""
        ports = self._guard("infiniband", self.ib.scan) if self.ib is not None else []
        hcas = ",".join(f"{dev}:{n}" for dev, n, _ in ports or [])  # an HCA gone renumbers the NIC slots
        return f"boot={boot};gpus={gpus};hcas={hcas};mounts={mounts}"

    def _restore_edges(self) -> None:
        """Start from the edges the agent's last run stored with its events, when it ran on this boot and
        hardware (decision 0132): a condition that still stands (a row-remap failure, a missing mount, a
        link down) was reported then and is not reported again, with a new id, to drain a node an operator
        may have put back on purpose."""
        self._restored = True
        if self.spool is None:
            return
        kept = self.spool.armed(self._scope())
        self.checks.restore_armed(kept)
        if kept:
            log.info("%s: %d edge(s) kept from the last run on this boot: conditions that still stand are "
                     "not reported again", self.node, len(kept))

    def _xids(self, xids: Sequence[XidEvent]) -> None:
        events: list[HealthEvent] = []
        for x in xids:
            self.telemetry.count_xid(x.index, x.code)
            events += self._local([self.checks.on_xid(x)], "nvml", x.index)
        self.emit(events)

    def handle_xids(self, xids: Sequence[XidEvent]) -> None:
        """Count and report XID events (the run loop calls this; tests may too)."""
        self._xids(xids)

    def emit(self, events: Sequence[HealthEvent], armed: Collection[str] | None = None) -> None:
        counts = self.telemetry.events
        for ev in events:
            counts[ev.kind.value] = counts.get(ev.kind.value, 0) + 1
            log.info(
                "%s: %s %s %s: %s",
                ev.node,
                ev.kind.value,
                ev.component or "-",
                ev.severity.value if ev.severity else "-",
                ev.message,
            )
        if self.spool is not None:
            self.spool.put(events, armed)
        if self.on_events is not None:
            self.on_events(events)
        if self.kmsg is not None:
            self._guard("kmsg", self.kmsg.commit)  # the position moves only once the events are safe
        if self.wake_pusher is not None:
            self.wake_pusher.set()

    # --- helpers ----------------------------------------------------------------------------
    def _local(
        self, events: Sequence[HealthEvent], source: str | None = None, gpu: int | None = None
    ) -> list[HealthEvent]:
        """Name the local identities the controller maps to topology ids (docs/agent.md, "Identities"):
        ``gpu`` (NVML index) and ``pci`` on every GPU event, whichever source saw it; ``source`` = the
        collector (a kernel-log source names itself). A device the node does not know (a PCI address
        that is no GPU of this node) or none is reported against the node, the address kept in ``pci``."""
        out: list[HealthEvent] = []
        for ev in events:
            attrs = dict(ev.attrs)
            index = gpu if gpu is not None and gpu >= 0 else self._gpu_of.get(attrs.get("pci", ""))
            if index is not None:
                attrs.setdefault("gpu", str(index))
                if index in self._pci:
                    attrs.setdefault("pci", self._pci[index])
            component = ev.component
            if component is None or _PCI.fullmatch(component):
                component = self.node
            out.append(
                replace(
                    ev,
                    component=component,
                    source=source or ev.source,
                    attrs=tuple(attrs.items()) if attrs != dict(ev.attrs) else ev.attrs,
                )
            )
        return out

    def _due(self, name: str, mono: float, every: float) -> bool:
        if mono < self._next[name]:
            return False
        nxt = self._next[name] + every
        self._next[name] = nxt if nxt > mono else mono + every  # fell behind: skip, don't burst
        return True

    def _guard(self, name: str, fn: Callable[..., _T], *args: object) -> _T | None:
        try:
            return fn(*args)
        except Exception:
            errs = self.telemetry.collector_errors
            n = errs.get(name, 0) + 1
            errs[name] = n
            if n == 1 or n % 100 == 0:
                log.exception("%s: collector %s failed (%d so far); continuing", self.node, name, n)
            return None
