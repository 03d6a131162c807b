"""An in-process simulated scheduler: the demo's and the tests' cluster.

It behaves like a small Slurm: nodes carry a drain flag and a reason, jobs run on nodes, a drained
node with running jobs shows ``DRAINING`` until the jobs end. Test and demo code drive it through the
extra methods (``add_node``, ``submit``, ``finish``, ``checkpoint``, ``set_reachable``). State can be
persisted to a JSON file so a restarted process sees the same cluster (crash tests).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from gpufleet.domain.errors import Conflict, ExternalError, InvalidInput, NotFound
from gpufleet.schedulers.port import REASON_PREFIX, Job, JobState, SchedNode, SchedNodeState, keeping_reason


@dataclass(slots=True)
class _Node:
    name: str
    drain: bool = False
    down: bool = False
    reason: str = ""
    last: bool = False  # place_last


@dataclass(slots=True)
class _State:
    nodes: dict[str, _Node] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    next_job: int = 1
    # Every effect that changed the cluster, in order: ("drain"|"resume"|"requeue"|"signal"|"place_last"|
    # "place_normally", target, detail)
    effects: list[tuple[str, str, str]] = field(default_factory=list)


class SimScheduler:
    """A thread-safe in-memory scheduler implementing :class:`~gpufleet.schedulers.port.Scheduler`."""

    name = "sim"

    def __init__(self, nodes: Iterable[str] = (), *, state_file: Path | None = None,
                 checkpoint_signal: str = "") -> None:
        self._lock = threading.RLock()
        self.checkpoint_signal = checkpoint_signal  # the site-wide default for jobs that declared none
        self._state_file = state_file
        self._reachable = True
        self._s = _State()
        if state_file is not None and state_file.exists():
            self._load(state_file)
        for n in nodes:
            self._s.nodes.setdefault(n, _Node(n))
        self._save()

    # ---- the port ---------------------------------------------------------------------------
    def list_nodes(self, *, jobs: bool = True) -> Sequence[SchedNode]:  # the job ids cost nothing here
        with self._lock:
            self._check_reachable()
            return [self._view(n) for n in self._s.nodes.values()]

    def node(self, name: str) -> SchedNode:
        with self._lock:
            self._check_reachable()
            return self._view(self._get(name))

    def list_jobs(self) -> Sequence[Job]:
        with self._lock:
            self._check_reachable()
            return list(self._s.jobs.values())

    def job(self, job_id: str) -> Job:
        with self._lock:
            self._check_reachable()
            if job_id not in self._s.jobs:
                raise NotFound("job", job_id)
            return self._s.jobs[job_id]

    def jobs_on(self, node: str) -> Sequence[Job]:
        with self._lock:
            self._check_reachable()
            self._get(node)
            return [j for j in self._s.jobs.values() if j.state == JobState.RUNNING and node in j.nodes]

    def drain(self, node: str, reason: str) -> bool:
        with self._lock:
            self._check_reachable()
            n = self._get(node)
            if not reason:
                raise InvalidInput("reason", reason, "a non-empty drain reason")
            if n.drain:
                return False  # idempotent; a foreign reason is kept
            if n.down:  # someone else's reason for the node being down is kept after ours (decision 0131)
                reason = keeping_reason(reason, n.reason)
            n.drain, n.reason = True, reason
            self._effect("drain", node, reason)
            return True

    def set_down(self, node: str, reason: str) -> None:
        """Mark ``node`` down the way an operator would (``scontrol update state=down reason=...``): as
        Slurm does, the jobs running on it end (FAILED, Slurm's NODE_FAIL)."""
        with self._lock:
            n = self._get(node)
            n.down, n.reason = True, reason
            for j in list(self._s.jobs.values()):
                if j.state == JobState.RUNNING and node in j.nodes:
                    self._s.jobs[j.id] = replace(j, state=JobState.FAILED)
            self._effect("down", node, reason)

    def resume(self, node: str) -> None:
        with self._lock:
            self._check_reachable()
            n = self._get(node)
            if not n.drain and not n.down:
                return
            if not n.reason.startswith(REASON_PREFIX):
                raise Conflict(f"node {node} was drained by someone else ({n.reason!r}); not resuming it")
            n.drain = n.down = False
            n.reason = ""
            self._effect("resume", node, "")

    def requeue(self, job_id: str) -> None:
        with self._lock:
            self._check_reachable()
            job = self._job(job_id)
            if job.state != JobState.RUNNING:
                return
            self._s.jobs[job_id] = replace(job, state=JobState.PENDING, nodes=(), restarts=job.restarts + 1)
            self._effect("requeue", job_id, "")

    def signal(self, job_id: str, signal: str) -> None:
        with self._lock:
            self._check_reachable()
            self._job(job_id)
            self._effect("signal", job_id, signal)

    def request_checkpoint(self, job_id: str) -> str:
        """Record the request (effect ``checkpoint_request``) with the signal the job declared at
        :meth:`submit` (else the site default); a job with neither is not asked (``""``). The simulated
        job answers through :meth:`checkpoint` when the test or the demo decides it does."""
        with self._lock:
            self._check_reachable()
            job = self._job(job_id)
            if job.state != JobState.RUNNING:
                raise NotFound("running job", job_id)
            sig = job.checkpoint_signal or self.checkpoint_signal
            if not sig:
                return ""
            self._effect("checkpoint_request", job_id, sig)
            return sig

    def checkpoint_requests(self, job_id: str) -> int:
        """How often ``job_id`` was asked to checkpoint."""
        with self._lock:
            return sum(1 for what, target, _ in self._s.effects if what == "checkpoint_request" and target == job_id)

    # ---- simulation control -----------------------------------------------------------------
    def add_node(self, name: str) -> None:
        with self._lock:
            self._s.nodes.setdefault(name, _Node(name))
            self._save()

    def set_reachable(self, reachable: bool) -> None:
        """Simulate the scheduler being down (every port call raises ExternalError)."""
        self._reachable = reachable

    def submit(self, name: str, nodes: Sequence[str], *, start: datetime, checkpoint_signal: str = "") -> Job:
        """Start a job on ``nodes`` at once (they must be schedulable and free). ``checkpoint_signal``:
        the signal the job declares it handles by checkpointing (its opt-in to checkpoint requests)."""
        with self._lock:
            for node in nodes:
                n = self._get(node)
                if n.drain or n.down:
                    raise Conflict(f"node {node} is not schedulable")
                if any(node in j.nodes for j in self._s.jobs.values() if j.state == JobState.RUNNING):
                    raise Conflict(f"node {node} is busy")
            job = Job(id=str(self._s.next_job), name=name, state=JobState.RUNNING, nodes=tuple(nodes),
                      start_time=start, checkpoint_signal=checkpoint_signal.upper().removeprefix("SIG"))
            self._s.next_job += 1
            self._s.jobs[job.id] = job
            self._save()
            return job

    def restart(self, job_id: str, nodes: Sequence[str], *, start: datetime) -> Job:
        """Place a pending (requeued) job on ``nodes``."""
        with self._lock:
            job = self._job(job_id)
            self._s.jobs[job_id] = replace(job, state=JobState.RUNNING, nodes=tuple(nodes), start_time=start)
            self._save()
            return self._s.jobs[job_id]

    def finish(self, job_id: str, state: JobState = JobState.COMPLETED) -> None:
        with self._lock:
            job = self._job(job_id)
            self._s.jobs[job_id] = replace(job, state=state)
            self._save()

    def checkpoint(self, job_id: str, at: datetime) -> None:
        with self._lock:
            job = self._job(job_id)
            self._s.jobs[job_id] = replace(job, last_checkpoint=at)
            self._save()

    def place_last(self, node: str, last: bool) -> None:
        with self._lock:
            self._check_reachable()
            n = self._get(node)
            if n.last == last:
                return
            n.last = last
            self._effect("place_last" if last else "place_normally", node, "")

    def schedulable(self) -> list[str]:
        """Free nodes in placement order: nodes kept last (suspects) after every other."""
        with self._lock:
            busy = {n for j in self._s.jobs.values() if j.state == JobState.RUNNING for n in j.nodes}
            free = [n for n in self._s.nodes.values() if not (n.drain or n.down) and n.name not in busy]
            return [n.name for n in sorted(free, key=lambda n: n.last)]

    @property
    def effects(self) -> list[tuple[str, str, str]]:
        with self._lock:
            return list(self._s.effects)

    # ---- internals --------------------------------------------------------------------------
    def _check_reachable(self) -> None:
        if not self._reachable:
            raise ExternalError("sim-scheduler", "scheduler unreachable (simulated outage)")

    def _get(self, name: str) -> _Node:
        try:
            return self._s.nodes[name]
        except KeyError:
            raise NotFound("node", name) from None

    def _job(self, job_id: str) -> Job:
        try:
            return self._s.jobs[job_id]
        except KeyError:
            raise NotFound("job", job_id) from None

    def _view(self, n: _Node) -> SchedNode:
        jobs = tuple(j.id for j in self._s.jobs.values() if j.state == JobState.RUNNING and n.name in j.nodes)
        if n.drain:  # a drain outranks down, as Slurm (DOWN+DRAIN reads DRAINED) and Kubernetes show it
            state = SchedNodeState.DRAINING if jobs else SchedNodeState.DRAINED
        elif n.down:
            state = SchedNodeState.DOWN
        else:
            state = SchedNodeState.ALLOCATED if jobs else SchedNodeState.IDLE
        return SchedNode(name=n.name, state=state, reason=n.reason, jobs=jobs, placed_last=n.last)

    def _effect(self, what: str, target: str, detail: str) -> None:
        self._s.effects.append((what, target, detail))
        self._save()

    def _save(self) -> None:
        if self._state_file is None:
            return
        doc = {
            "nodes": [[n.name, n.drain, n.down, n.reason, n.last] for n in self._s.nodes.values()],
            "jobs": [[j.id, j.name, j.state, list(j.nodes), j.restarts, j.checkpoint_signal]
                     for j in self._s.jobs.values()],
            "next_job": self._s.next_job,
            "effects": self._s.effects,
        }
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self._state_file)

    def _load(self, path: Path) -> None:
        doc = json.loads(path.read_text())
        self._s.nodes = {r[0]: _Node(r[0], r[1], r[2], r[3], bool(r[4]) if len(r) > 4 else False)
                         for r in doc["nodes"]}
        self._s.jobs = {
            r[0]: Job(id=r[0], name=r[1], state=JobState(r[2]), nodes=tuple(r[3]), restarts=r[4],
                      checkpoint_signal=r[5] if len(r) > 5 else "") for r in doc["jobs"]
        }
        self._s.next_job = doc["next_job"]
        self._s.effects = [(str(e[0]), str(e[1]), str(e[2])) for e in doc["effects"]]
