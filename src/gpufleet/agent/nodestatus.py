"""The node status file the agent keeps for Slurm's HealthCheckProgram (``gpufleet slurm healthcheck``).

Format ``gpufleet.node-status/v1`` (gpufleet.domain.nodestatus, docs/agent.md): the node, the time
it was written, the worst severity among the faults the agent saw within ``status_hold_s`` (default
10 min) and one reason per fault. The agent judges its own events here with the shipped catalog (the
one judgement function, gpufleet.domain.judgement): it is the local fallback for when the controller
cannot be reached, so it cannot wait for the controller's judgement. Only ``fatal`` makes the hook
drain; the controller's decisions stay authoritative while it is up (a drain by either is the same
drain, and gpufleet resumes a ``gpufleet:healthcheck`` drain like its own).

* **Atomic:** written to a temporary file in the same directory, fsynced, renamed over the old one.
* **Fresh:** rewritten every ``status_interval_s`` (default 10 s) even when nothing changed, so its
  ``time`` says the agent is alive; a file older than the hook's ``--max-age`` is reported as stale in
  slurmd's log and not acted on (a dead agent is not a GPU fault).
* **Cleared by a repair:** a repair command that worked (agent/commands.py) forgets the faults seen
  before it, so the node is not drained again for a fault that was just repaired.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from gpufleet.agent.clock import AgentClock
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.events import HealthEvent, Severity
from gpufleet.domain.judgement import judge_event
from gpufleet.domain.nodestatus import NodeStatus

log = logging.getLogger(__name__)
_MAX_REASONS = 8


def write_status(path: Path, status: NodeStatus) -> None:
    """Write the status file atomically (temporary file in the same directory, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(status.to_json()) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


class NodeStatusWriter:
    def __init__(self, path: Path, node: str, catalog: Catalog, clock: AgentClock, *,
                 hold: timedelta = timedelta(minutes=10), interval: float = 10.0) -> None:
        self.path, self.node, self.catalog, self.clock = path, node, catalog, clock
        self.hold, self.interval = hold, interval
        self._seen: list[tuple[datetime, Severity, str]] = []  # (when the agent saw it, severity, reason)
        self._lock = threading.Lock()
        self._failing = False

    def observe(self, events: Sequence[HealthEvent]) -> None:
        """The agent's events (``Agent.on_events``): faults are kept for ``hold``."""
        now = self.clock.now()
        found = []
        for e in events:
            j = judge_event(self.catalog, e)
            if j.collateral or j.severity not in (Severity.DEGRADED, Severity.FATAL):
                continue
            where = f" on {e.component}" if e.component else ""
            code = f" {e.code}" if e.code is not None else ""
            name = f" ({j.name})" if j.name and j.name != str(e.kind) else ""
            found.append((now, j.severity, f"{e.kind}{code}{name}{where}: {j.severity}"))
        if found:
            with self._lock:
                self._seen += found
            if any(sev == Severity.FATAL for _, sev, _ in found):
                self.write()  # at once: the health check should not wait for the next interval

    def clear(self, why: str) -> None:
        """Forget the faults seen so far (a repair just fixed them)."""
        with self._lock:
            self._seen = []
        log.info("%s: node status cleared (%s)", self.node, why)
        self.write()

    def status(self) -> NodeStatus:
        now = self.clock.now()
        with self._lock:
            self._seen = [s for s in self._seen if now - s[0] <= self.hold]
            seen = list(self._seen)
        if not seen:
            return NodeStatus(self.node, now, "ok")
        worst = max(seen, key=lambda s: s[1].rank)[1]
        reasons = list(dict.fromkeys(r for _, sev, r in seen if sev == worst))[-_MAX_REASONS:]
        return NodeStatus(self.node, now, worst.value, tuple(reasons))

    def write(self) -> bool:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_status(self.path, self.status())
        except OSError as err:
            if not self._failing:
                log.error("%s: cannot write the node status file %s (%s): slurmd's HealthCheckProgram "
                          "will report it stale", self.node, self.path, err)
            self._failing = True
            return False
        self._failing = False
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.write()
            stop.wait(self.interval)
