"""The node status file the agent keeps for Slurm's HealthCheckProgram (``gpufleet slurm healthcheck``).

Format ``gpufleet.node-status/v1`` (gpufleet.domain.nodestatus, docs/agent.md): the node, the time
it was written, and the observations the agent made within ``status_hold_s`` (default
10 min). The agent judges nothing: the hook judges them with the one judging
function (``domain.nodestatus.verdict``: the shipped catalog, or the site's policy file given to the
hook), so the same site overrides apply as in the controller. Only ``fatal`` makes the hook drain;
the controller's decisions stay authoritative while it is up (a drain by either is the same drain,
and gpufleet resumes a ``gpufleet:healthcheck`` drain like its own).

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
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from gpufleet.agent.clock import AgentClock
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.nodestatus import NodeStatus, Observation
from gpufleet.files import write_atomic

log = logging.getLogger(__name__)
_MAX_OBSERVATIONS = 64  # the newest kept in the file
_NOT_FAULTS = frozenset({EventKind.CHECK_PASSED, EventKind.MOVED, EventKind.HEARTBEAT_LOST})


def write_status(path: Path, status: NodeStatus) -> None:
    """Write the status file atomically (temporary file in the same directory, fsync, rename)."""
    write_atomic(path, json.dumps(status.to_json()) + "\n")


class NodeStatusWriter:
    def __init__(self, path: Path, node: str, clock: AgentClock, *,
                 hold: timedelta = timedelta(minutes=10), interval: float = 10.0,
                 reached: Callable[[], datetime | None] | None = None) -> None:
        self.path, self.node, self.clock = path, node, clock
        self.hold, self.interval = hold, interval
        self.reached = reached  # when the agent last delivered to the controller (the pusher's last success)
        self._seen: list[tuple[datetime, Observation]] = []  # (when the agent saw it, what it saw)
        self._lock = threading.Lock()
        self._failing = False

    def observe(self, events: Sequence[HealthEvent]) -> None:
        """The agent's events (``Agent.on_events``): kept for ``hold``; written at once (the health
        check should not wait for the next interval)."""
        now = self.clock.now()
        found = [(now, Observation(e.kind.value, e.code, e.component or "", e.attr("rule"),
                                   e.severity.value if e.severity else "", e.attr("nvl5_row")))
                 for e in events if e.kind not in _NOT_FAULTS]
        if found:
            with self._lock:
                self._seen += found
            self.write()

    def clear(self, why: str) -> None:
        """Forget the faults seen so far (a repair just fixed them)."""
        with self._lock:
            self._seen = []
        log.info("%s: node status cleared (%s)", self.node, why)
        self.write()

    def status(self) -> NodeStatus:
        now = self.clock.now()
        with self._lock:
            self._seen = [s for s in self._seen if now - s[0] <= self.hold][-_MAX_OBSERVATIONS:]
            seen = tuple(o for _, o in self._seen)
        return NodeStatus(self.node, now, "ok", observations=seen,
                          controller_reached=self.reached() if self.reached is not None else None)

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
