"""A simulated data-parallel training job: checkpoints, interruptions, restarts, and its goodput.

The job runs on ``size`` nodes, writes a blocking checkpoint every ``interval``, and loses the
progress since its last checkpoint when it is interrupted (a crash, or a requeue by the controller).
After an interruption it restarts once ``size`` healthy nodes are free, paying ``restart`` time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from gpufleet.domain.errors import Conflict
from gpufleet.schedulers.port import JobState
from gpufleet.schedulers.sim import SimScheduler


class Phase(StrEnum):
    STARTING = "starting"  # loading the checkpoint, initialising
    TRAINING = "training"
    WAITING = "waiting for nodes"


@dataclass
class TrainingJob:
    scheduler: SimScheduler
    size: int
    interval: timedelta = timedelta(minutes=15)  # near Young's optimum for the demo's fault rate
    write: timedelta = timedelta(seconds=60)
    restart: timedelta = timedelta(minutes=5)
    job_id: str = ""
    phase: Phase = Phase.WAITING
    phase_since: datetime | None = None
    last_ckpt: datetime | None = None
    interruptions: int = 0
    badput: dict[str, float] = field(default_factory=lambda: {
        "lost_progress": 0.0, "restart": 0.0, "waiting_for_nodes": 0.0, "checkpoint_write": 0.0})
    useful: float = 0.0
    elapsed: float = 0.0
    causes: list[str] = field(default_factory=list)
    # Placement preference (lower sorts first): the world puts suspect nodes last, as a scheduler
    # does when gpufleet lowers a suspect node's weight.
    prefer: Callable[[str], tuple[int, str]] = lambda n: (0, n)

    def step(self, now: datetime, dt: timedelta) -> None:
        """Advance the job by ``dt`` ending at ``now``."""
        secs = dt.total_seconds()
        self.elapsed += secs
        if self.job_id and self._state() != JobState.RUNNING and self.phase != Phase.WAITING:
            self.interrupt(now, "requeued by the controller")
        if self.phase == Phase.WAITING:
            self.badput["waiting_for_nodes"] += secs
            self._try_start(now)
        elif self.phase == Phase.STARTING:
            self.badput["restart"] += secs
            assert self.phase_since is not None
            if now - self.phase_since >= self.restart:
                self.phase, self.phase_since, self.last_ckpt = Phase.TRAINING, now, now
        else:
            assert self.last_ckpt is not None
            if now - self.last_ckpt >= self.interval:
                self.badput["checkpoint_write"] += self.write.total_seconds()
                self.useful += secs - self.write.total_seconds()
                self.last_ckpt = now
                self.scheduler.checkpoint(self.job_id, now)
            else:
                self.useful += secs

    def interrupt(self, now: datetime, cause: str) -> None:
        """The job dies now; the work since its last checkpoint is lost."""
        if self.phase == Phase.WAITING:
            return
        if self.phase == Phase.TRAINING and self.last_ckpt is not None:
            lost = (now - self.last_ckpt).total_seconds()
            self.useful -= lost
            self.badput["lost_progress"] += lost
        self.interruptions += 1
        self.causes.append(cause)
        if self.job_id and self._state() == JobState.RUNNING:
            self.scheduler.requeue(self.job_id)
        self.phase, self.phase_since = Phase.WAITING, now

    def nodes(self) -> tuple[str, ...]:
        if not self.job_id or self.phase == Phase.WAITING:
            return ()
        job = {j.id: j for j in self.scheduler.list_jobs()}[self.job_id]
        return job.nodes

    @property
    def ettr(self) -> float:
        return max(0.0, self.useful) / self.elapsed if self.elapsed else 1.0

    def _state(self) -> JobState:
        return {j.id: j for j in self.scheduler.list_jobs()}[self.job_id].state

    def _try_start(self, now: datetime) -> None:
        free = sorted(self.scheduler.schedulable(), key=self.prefer)
        if len(free) < self.size:
            return
        try:
            if self.job_id:
                self.scheduler.restart(self.job_id, free[: self.size], start=now)
            else:
                self.job_id = self.scheduler.submit("llm-pretrain", free[: self.size], start=now).id
        except Conflict:
            return
        self.phase, self.phase_since = Phase.STARTING, now
