"""A simulated data-parallel training job whose goodput is accounted by ``gpufleet.goodput``.

The job runs on ``size`` nodes, writes a blocking checkpoint every ``interval``, and loses the
progress since its last checkpoint when it is interrupted (a crash, or a requeue by the controller).
After an interruption it restarts once ``size`` healthy nodes are free, paying ``restart`` time.
Every step is recorded on a :class:`~gpufleet.goodput.recorder.Recorder` timeline, so ETTR and the
badput breakdown come from the same code real job accounting uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from gpufleet.domain.errors import Conflict
from gpufleet.goodput.ettr import GoodputReport, compute
from gpufleet.goodput.recorder import Recorder
from gpufleet.goodput.timeline import JobTimeline, TimelineEvent, TimelineEventKind
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
    start: datetime
    interval: timedelta = timedelta(minutes=15)  # near Young's optimum for the demo's fault rate
    write: timedelta = timedelta(seconds=60)
    restart: timedelta = timedelta(minutes=5)
    job_id: str = ""
    phase: Phase = Phase.WAITING
    phase_since: datetime | None = None
    last_ckpt: datetime | None = None
    interruptions: int = 0
    causes: list[str] = field(default_factory=list)
    # Placement preference (lower sorts first): the world puts suspect nodes last, as a scheduler
    # does when gpufleet lowers a suspect node's weight.
    prefer: Callable[[str], tuple[int, str]] = lambda n: (0, n)
    # Which free nodes may take the job at all (the world: not while burning in, as a real scheduler's
    # maintenance reservation would keep them).
    usable: Callable[[str], bool] = lambda n: True
    _now: datetime | None = None
    rec: Recorder = field(init=False)

    def __post_init__(self) -> None:
        self._now = self.start
        self.rec = Recorder(clock=self._elapsed)
        self.rec.submit()

    def step(self, now: datetime, dt: timedelta) -> None:
        """Advance the job by ``dt`` ending at ``now``."""
        if self.job_id and self._state() != JobState.RUNNING and self.phase != Phase.WAITING:
            self.interrupt(now, "requeued by the controller", planned=True)
        if self.phase == Phase.WAITING:
            self._try_start(now)
        elif self.phase == Phase.STARTING:
            assert self.phase_since is not None
            if now - self.phase_since >= self.restart:
                self._at(now).initialised()
                self.phase, self.phase_since, self.last_ckpt = Phase.TRAINING, now, now
        elif self.last_ckpt is not None and now - self.last_ckpt >= self.interval:
            self._at(now - self.write).checkpoint_start()
            self._at(now).checkpoint_end()
            self.last_ckpt = now
            self.scheduler.checkpoint(self.job_id, now)

    def interrupt(self, now: datetime, cause: str, *, planned: bool = False) -> None:
        """The job dies now (or is stopped by the controller); work since the last checkpoint is lost."""
        if self.phase == Phase.WAITING:
            return
        if planned:
            self._at(now).maintenance(cause)
        else:
            self._at(now).failure(cause)
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

    def report(self, now: datetime) -> GoodputReport:
        """Goodput so far: the recorded timeline, closed at ``now``."""
        events = self.rec.timeline().events
        end = TimelineEvent((now - self.start).total_seconds(), TimelineEventKind.END)
        return compute(JobTimeline((*events, end)))

    def _elapsed(self) -> float:
        return ((self._now or self.start) - self.start).total_seconds()

    def _at(self, when: datetime) -> Recorder:
        self._now = when
        return self.rec

    def _state(self) -> JobState:
        return {j.id: j for j in self.scheduler.list_jobs()}[self.job_id].state

    def _try_start(self, now: datetime) -> None:
        free = sorted((n for n in self.scheduler.schedulable() if self.usable(n)), key=self.prefer)
        if len(free) < self.size:
            return
        try:
            if self.job_id:
                self.scheduler.restart(self.job_id, free[: self.size], start=now)
            else:
                self.job_id = self.scheduler.submit("llm-pretrain", free[: self.size], start=now).id
        except Conflict:
            return
        self._at(now).start()
        self.phase, self.phase_since = Phase.STARTING, now
