"""Reads every BMC's event log and firmware versions in the background (docs/bmc.md).

* **SEL -> health events.** Every ``sel_interval`` each BMC's log entries are read; the hardware ones
  (``controller.bmc.sel``) become observations posted through :meth:`Controller.ingest` — the one
  event path: the controller names, judges (the catalog's ``bmc_*`` rules), merges and decides exactly
  as for an agent's event. An entry is one event id (log service, entry id, time): read again on the
  next poll or after a restart it is a duplicate the store drops; entries older than ``sel_max_age``
  (or older than the node's registration, to the store's rules) are not posted.
* **Firmware inventory.** Every ``firmware_interval`` the BMC, BIOS and ``FirmwareInventory`` versions
  are read and kept for ``GET /v1/firmware`` (with the fleet's drift: versions that differ from the
  most common one for the same component); a change is audited (``firmware_changed``).

A BMC that does not answer is logged (WARNING, once per outage) and tried again next time; it never
stops the others. Credentials never reach a log line, the audit log or the API (``bmc.credentials``).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufleet.domain.errors import ExternalError, GpufleetError
from gpufleet.domain.events import HealthEvent

from ..service import Controller
from .redfish import Firmware, RedfishBmc
from .sel import entry_event

log = logging.getLogger(__name__)
_SEEN_KEEP = 20_000  # event ids remembered per node (beyond: the store's dedup still holds)


@dataclass(frozen=True, slots=True)
class FirmwareRecord:
    node: str
    read: datetime
    firmware: Firmware


class BmcWatcher:
    def __init__(self, controller: Controller, bmcs: Mapping[str, RedfishBmc], *,
                 sel_max_age: timedelta = timedelta(days=1)) -> None:
        self.c, self.bmcs, self.sel_max_age = controller, dict(bmcs), sel_max_age
        self._seen: dict[str, dict[str, None]] = {}
        self._down: set[str] = set()
        self.firmware: dict[str, FirmwareRecord] = {}
        self._lock = threading.Lock()

    # ---- SEL --------------------------------------------------------------------------------
    def poll_sel(self) -> int:
        """Read every BMC's log once; returns the events accepted (new to the store)."""
        accepted = 0
        for node, bmc in self.bmcs.items():
            if node not in self.c.engine.nodes:
                continue  # not registered (yet): its events would be refused
            try:
                entries = bmc.sel_entries()
            except ExternalError as err:
                self._unreachable(node, err)
                continue
            self._reachable(node)
            accepted += self._post(node, entries)
        return accepted

    def _post(self, node: str, entries: list[dict[str, Any]]) -> int:
        now = self.c.clock.now()
        seen = self._seen.setdefault(node, {})
        fresh: list[HealthEvent] = []
        for entry in entries:
            ev = entry_event(node, entry, fallback_time=now)
            if ev is None or ev.id in seen or ev.time < now - self.sel_max_age:
                continue
            fresh.append(ev)
        if not fresh:
            return 0
        try:
            res = self.c.ingest(fresh)
        except GpufleetError as err:
            log.error("%s: BMC event log entries refused: %s", node, err)
            return 0
        for ev in fresh:
            seen[ev.id] = None
        while len(seen) > _SEEN_KEEP:
            seen.pop(next(iter(seen)))
        if res.accepted:
            log.info("%s: %d BMC event log entr%s posted", node, res.accepted, "y" if res.accepted == 1 else "ies")
        return int(res.accepted)

    # ---- firmware ---------------------------------------------------------------------------
    def poll_firmware(self) -> int:
        read = 0
        for node, bmc in self.bmcs.items():
            try:
                fw = bmc.firmware()
            except ExternalError as err:
                self._unreachable(node, err)
                continue
            self._reachable(node)
            with self._lock:
                old = self.firmware.get(node)
                self.firmware[node] = FirmwareRecord(node, self.c.clock.now(), fw)
            if old is not None and old.firmware != fw:
                self.c.audit(node, "firmware_changed", f"{_summary(old.firmware)} -> {_summary(fw)}", actor_id="bmc")
            read += 1
        return read

    def inventory(self) -> list[dict[str, Any]]:
        """Every node's last-read firmware, each version marked ``drift`` when it differs from the
        fleet's most common version of the same component (same component name)."""
        with self._lock:
            recs = sorted(self.firmware.values(), key=lambda r: r.node)
        rows = [(r, _versions(r.firmware)) for r in recs]
        common: dict[str, str] = {}
        counts: dict[str, Counter[str]] = {}
        for _, vs in rows:
            for comp, v in vs.items():
                counts.setdefault(comp, Counter())[v] += 1
        for comp, c in counts.items():
            common[comp] = c.most_common(1)[0][0]
        return [{"node": r.node, "read": r.read, "bmc": r.firmware.bmc, "bios": r.firmware.bios,
                 "components": [{"component": comp, "version": v, "fleet_common": common[comp],
                                 "drift": v != common[comp]} for comp, v in sorted(vs.items())]}
                for r, vs in rows]

    # ---- loop -------------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event, sel_interval: float, firmware_interval: float,
                    leading: Callable[[], bool] = lambda: True) -> None:
        next_fw = 0.0
        clock = 0.0
        step = sel_interval or firmware_interval
        while not stop.is_set():
            try:
                if leading():  # only the leader replica polls the BMCs (and ingests what they say)
                    if sel_interval:
                        self.poll_sel()
                    if firmware_interval and clock >= next_fw:
                        self.poll_firmware()
                        next_fw = clock + firmware_interval
            except Exception:  # never let the watcher die
                log.exception("BMC watcher pass failed")
            stop.wait(step)
            clock += step

    def _unreachable(self, node: str, err: ExternalError) -> None:
        if node not in self._down:
            self._down.add(node)
            log.warning("%s: BMC unreachable: %s", node, err)

    def _reachable(self, node: str) -> None:
        if node in self._down:
            self._down.discard(node)
            log.info("%s: BMC reachable again", node)


def _versions(fw: Firmware) -> dict[str, str]:
    out = {"BMC": fw.bmc, "BIOS": fw.bios}
    for item in fw.components:
        out[item.name or item.id] = item.version
    return {k: v for k, v in out.items() if v}


def _summary(fw: Firmware) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(_versions(fw).items()))[:500]
