"""ETTR, MTTF, interruptions and the badput breakdown of one job timeline.

Definitions (docs/goodput.md):

* **elapsed** = first event -> ``END`` (or the last event). Queue time before the first start counts
  when a ``SUBMIT`` is recorded (Kokolis et al.'s ETTR); without it the clock starts at the first
  start (Google's goodput). A ``SUBMIT`` between an interruption and the next start (the job requeued,
  waiting for nodes) ends the interruption's own share of the gap: after a planned stop, the time
  before it is ``planned_maintenance`` and the time after it ``waiting``.
* **productive** = time spent training, minus the training that an interruption threw away (work
  after the last durable checkpoint snapshot).
* **ETTR** = productive / elapsed, in [0, 1]. Every second of elapsed is either productive or in
  exactly one badput bucket, so ``productive + badput.total == elapsed``.
* **MTTF** = time the job held its nodes (start to interruption, summed over attempts) divided by
  the number of unexpected interruptions.

Events that make no sense in the job's current phase (a checkpoint while waiting, a second failure
before a restart) are ignored and counted in ``ignored_events``: real logs have gaps and repeats,
and an accounting tool must not fail on them. A ``START`` while the job is still running means an
interruption went unrecorded; it is counted as an unexpected interruption with cause
``unrecorded``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum, auto

from gpufleet.goodput.timeline import JobTimeline, TimelineEvent, TimelineEventKind

K = TimelineEventKind


@dataclass(frozen=True, slots=True)
class Badput:
    """Unproductive seconds by cause."""

    startup: float = 0.0  # start -> initialised (launch, communicators, compile)
    checkpoint_save: float = 0.0  # training blocked by checkpoint saves
    checkpoint_restore: float = 0.0  # loading the checkpoint after a (re)start
    lost_progress: float = 0.0  # training redone because it postdated the last durable checkpoint
    detection: float = 0.0  # interruption -> noticed (hangs until a watchdog or check fires)
    waiting: float = 0.0  # queued / requeued / waiting for nodes (after any interruption, from its SUBMIT)
    planned_maintenance: float = 0.0  # down after a planned stop until the next start
    health_check: float = 0.0  # training paused for in-job health checks
    data_wait: float = 0.0  # training blocked waiting for the input pipeline

    @property
    def total(self) -> float:
        return (
            self.startup + self.checkpoint_save + self.checkpoint_restore + self.lost_progress
            + self.detection + self.waiting + self.planned_maintenance + self.health_check + self.data_wait
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "startup": self.startup,
            "checkpoint_save": self.checkpoint_save,
            "checkpoint_restore": self.checkpoint_restore,
            "lost_progress": self.lost_progress,
            "detection": self.detection,
            "waiting": self.waiting,
            "planned_maintenance": self.planned_maintenance,
            "health_check": self.health_check,
            "data_wait": self.data_wait,
        }


@dataclass(frozen=True, slots=True)
class Interruptions:
    total: int = 0
    planned: int = 0
    unexpected: int = 0
    by_cause: tuple[tuple[str, int], ...] = ()  # most frequent first, ties by name


@dataclass(frozen=True, slots=True)
class GoodputReport:
    elapsed: float
    productive: float
    ettr: float
    mttf: float | None  # seconds; None when nothing failed unexpectedly
    interruptions: Interruptions
    badput: Badput
    attempts: int = 0
    checkpoints: int = 0  # durable checkpoints
    steps: int = 0
    ignored_events: int = 0
    by_cause_lost: tuple[tuple[str, float], ...] = field(default=())  # lost progress per cause


@dataclass(frozen=True, slots=True)
class Settled:
    """The accounting of ``[first event, time]`` at a *settled* point: a time before which no later event
    can change how a second is counted. Settled points are each (re)start (the interruption before it is
    accounted), the snapshot of each checkpoint that became durable (the training before it is kept) and
    the end. ``productive + badput.total`` is the elapsed time up to ``time``."""

    time: float
    productive: float
    badput: Badput


class _Phase(Enum):
    WAITING = auto()
    STARTING = auto()
    RESTORING = auto()
    TRAINING = auto()
    SAVING = auto()
    CHECKING = auto()
    DATA = auto()
    ENDED = auto()


_RUNNING = frozenset({_Phase.STARTING, _Phase.RESTORING, _Phase.TRAINING, _Phase.SAVING, _Phase.CHECKING,
                      _Phase.DATA})
_BUCKET = {
    _Phase.STARTING: "startup",
    _Phase.RESTORING: "checkpoint_restore",
    _Phase.SAVING: "checkpoint_save",
    _Phase.CHECKING: "health_check",
    _Phase.DATA: "data_wait",
}


class _Acc:
    """The accounting state machine (one pass over the events)."""

    def __init__(self) -> None:
        self.phase = _Phase.WAITING
        self.buckets: dict[str, float] = dict.fromkeys(Badput().as_dict(), 0.0)
        self.work = 0.0  # training seconds so far (productive + later lost)
        self.durable = 0.0  # ``work`` at the snapshot of the last durable checkpoint / attempt start
        self.snaps: dict[int | None, float] = {}
        self.gap = 0.0  # waiting time since the last interruption, not yet attributed
        self.planned_gap = False
        self.initialised = False
        self.started = False
        self.held = 0.0  # seconds the job held its nodes (MTTF numerator)
        self.causes: Counter[str] = Counter()
        self.lost_by_cause: dict[str, float] = {}
        self.planned = 0
        self.unexpected = 0
        self.attempts = 0
        self.checkpoints = 0
        self.steps = 0
        self.ignored = 0
        self.end = 0.0
        self.marks: list[Settled] = []
        self.pending: dict[int | None, Settled] = {}  # snapshot marks that become settled when durable

    def mark(self, time: float) -> Settled:
        buckets = dict(self.buckets)
        buckets["planned_maintenance" if self.planned_gap else "waiting"] += self.gap
        return Settled(time, max(0.0, self.work - buckets["lost_progress"]), Badput(**buckets))

    def elapse(self, dt: float) -> None:
        if dt <= 0:
            return
        ph = self.phase
        if ph is _Phase.TRAINING:
            self.work += dt
        elif ph is _Phase.WAITING:
            if self.started:
                self.gap += dt
            else:
                self.buckets["waiting"] += dt
        elif ph is not _Phase.ENDED:
            self.buckets[_BUCKET[ph]] += dt
        if ph in _RUNNING:
            self.held += dt

    def flush_gap(self) -> None:
        self.buckets["planned_maintenance" if self.planned_gap else "waiting"] += self.gap
        self.gap = 0.0

    def interrupt(self, cause: str, planned: bool) -> None:
        lost = self.work - self.durable
        self.buckets["lost_progress"] += lost
        self.lost_by_cause[cause] = self.lost_by_cause.get(cause, 0.0) + lost
        self.durable = self.work
        self.snaps.clear()
        self.pending.clear()
        self.causes[cause] += 1
        if planned:
            self.planned += 1
        else:
            self.unexpected += 1
        self.planned_gap = planned
        self.phase = _Phase.WAITING

    def start(self) -> None:
        if self.phase in _RUNNING:
            self.interrupt("unrecorded", planned=False)
        self.flush_gap()
        self.started = True
        self.initialised = False
        self.attempts += 1
        self.durable = self.work
        self.snaps.clear()
        self.phase = _Phase.STARTING

    def durable_at(self, key: int | None) -> None:
        snap = self.snaps.pop(key, None)
        if snap is None:
            self.ignored += 1
            return
        mark = self.pending.pop(key, None)
        if mark is not None:
            self.marks.append(mark)
        self.durable = max(self.durable, snap)
        self.checkpoints += 1


def settled(timeline: JobTimeline) -> tuple[Settled, ...]:
    """The settled points of ``timeline``, in time order (see :class:`Settled`). Consecutive points bound
    the intervals a job reports to the controller: an interval between two settled points is final."""
    if not timeline.events:
        return ()
    marks = sorted(_account(timeline.events).marks, key=lambda m: m.time)
    out: list[Settled] = []
    for m in marks:  # one point per time: the latest accounting wins (a restart at a checkpoint's time)
        if out and out[-1].time == m.time:
            out[-1] = m
        else:
            out.append(m)
    return tuple(out)


def compute(timeline: JobTimeline) -> GoodputReport:
    """Account ``timeline`` (see the module docstring for the rules)."""
    ev = timeline.events
    if not ev:
        return GoodputReport(0.0, 0.0, 0.0, None, Interruptions(), Badput())
    a = _account(ev)
    elapsed = a.end - ev[0].time
    badput = Badput(**a.buckets)
    productive = max(0.0, a.work - badput.lost_progress)
    ettr = min(1.0, productive / elapsed) if elapsed > 0 else 0.0
    by_cause = tuple(sorted(a.causes.items(), key=lambda kv: (-kv[1], kv[0])))
    return GoodputReport(
        elapsed=elapsed,
        productive=productive,
        ettr=ettr,
        mttf=a.held / a.unexpected if a.unexpected else None,
        interruptions=Interruptions(a.planned + a.unexpected, a.planned, a.unexpected, by_cause),
        badput=badput,
        attempts=a.attempts,
        checkpoints=a.checkpoints,
        steps=a.steps,
        ignored_events=a.ignored,
        by_cause_lost=tuple(sorted(a.lost_by_cause.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def _account(ev: tuple[TimelineEvent, ...]) -> _Acc:
    """One pass of the accounting state machine over ``ev`` (non-empty, time-ordered)."""
    a = _Acc()
    prev: float = ev[0].time
    a.end = ev[-1].time
    for e in ev:
        if a.phase is _Phase.ENDED:
            a.ignored += 1
            continue
        a.elapse(e.time - prev)
        prev = e.time
        ph, k = a.phase, e.kind
        if k in (K.START, K.RESTART):
            a.start()
            a.marks.append(a.mark(e.time))
        elif k is K.SUBMIT:
            if a.started and ph is _Phase.WAITING:
                # (Re)queued after an interruption, waiting for nodes: the interruption's own share of the
                # gap ends here (a planned stop's downtime); from here to the next start is waiting.
                a.flush_gap()
                a.planned_gap = False
            elif a.started:
                a.ignored += 1
        elif k is K.END:
            a.flush_gap()
            a.phase = _Phase.ENDED
            a.end = e.time
            a.marks.append(a.mark(e.time))
        elif k in (K.FAILURE, K.MAINTENANCE):
            if ph in _RUNNING:
                planned = k is K.MAINTENANCE
                a.interrupt(e.cause or ("planned" if planned else "unknown"), planned)
            else:
                a.ignored += 1
        elif k is K.DETECTED:
            if ph is _Phase.WAITING and a.started:
                a.buckets["detection"] += a.gap
                a.gap = 0.0
            else:
                a.ignored += 1
        elif ph not in _RUNNING:
            a.ignored += 1
        elif k is K.INITIALISED:
            a.initialised = True
            if ph is _Phase.STARTING:
                a.phase = _Phase.TRAINING
        elif k is K.STEP:
            a.steps += 1
            if ph is _Phase.STARTING:
                a.initialised = True
                a.phase = _Phase.TRAINING
        elif k is K.RESTORE_START:
            if ph in (_Phase.STARTING, _Phase.TRAINING):
                a.phase = _Phase.RESTORING
            else:
                a.ignored += 1
        elif k is K.RESTORE_END:
            if ph is _Phase.RESTORING:
                a.phase = _Phase.TRAINING if a.initialised else _Phase.STARTING
            else:
                a.ignored += 1
        elif k is K.CHECKPOINT_SAVE_START:
            if ph is _Phase.TRAINING:
                if e.checkpoint is None or e.checkpoint not in a.snaps:
                    a.snaps[e.checkpoint] = a.work
                    a.pending[e.checkpoint] = a.mark(e.time)
                # else: a second stall of an asynchronous checkpoint not yet durable (waiting for its
                # upload at the end): the snapshot and its settled point stay those of the first
                a.phase = _Phase.SAVING
            else:
                a.ignored += 1
        elif k is K.CHECKPOINT_SAVE_END:
            if ph is _Phase.SAVING:
                a.phase = _Phase.TRAINING
                if e.checkpoint is None:
                    a.durable_at(None)
            else:
                a.ignored += 1
        elif k is K.CHECKPOINT_PERSISTED:
            a.durable_at(e.checkpoint)
        elif k is K.HEALTH_CHECK_START:
            if ph is _Phase.TRAINING:
                a.phase = _Phase.CHECKING
            else:
                a.ignored += 1
        elif k is K.HEALTH_CHECK_END:
            if ph is _Phase.CHECKING:
                a.phase = _Phase.TRAINING
            else:
                a.ignored += 1
        elif k is K.DATA_WAIT_START:
            if ph is _Phase.TRAINING:
                a.phase = _Phase.DATA
            else:
                a.ignored += 1
        elif k is K.DATA_WAIT_END:
            if ph is _Phase.DATA:
                a.phase = _Phase.TRAINING
            else:
                a.ignored += 1
    if a.phase is not _Phase.ENDED:
        a.flush_gap()
    return a
