"""A training job's timeline: the events a job (or the simulator) records, in order.

Times are seconds on one clock (a float offset from any epoch the recorder chooses, e.g. the job's
submission). Real recorders that hold ``datetime`` values use :meth:`JobTimeline.from_datetimes`.

One *attempt* of a job runs ``START`` -> (``INITIALISED``) -> (``RESTORE_START`` -> ``RESTORE_END``) ->
training, with checkpoints, and ends with ``FAILURE`` (unexpected), ``MAINTENANCE`` (planned stop) or
``END``. The next attempt begins with the next ``START`` (``RESTART`` is accepted as a synonym and
reads better in logs). Between an interruption and the next start the job waits: optionally
``DETECTED`` marks the moment the failure was noticed (a hang is noticed only when a watchdog or a
health check fires), so the gap splits into *detection* and *waiting* (requeue, nodes).

Checkpoints: ``CHECKPOINT_SAVE_START`` snapshots the training state; the job is blocked until
``CHECKPOINT_SAVE_END``. A synchronous checkpoint is durable at ``CHECKPOINT_SAVE_END``; an asynchronous
one records ``CHECKPOINT_PERSISTED`` (with the same ``checkpoint`` id) when the upload finishes, and is
durable only then. Work done after the last durable snapshot is lost on an interruption.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from gpufleet.domain.errors import InvalidInput


class TimelineEventKind(StrEnum):
    SUBMIT = "submit"  # the job was submitted, or requeued after an interruption: queue time counts as waiting
    START = "start"  # processes launched on allocated nodes (an attempt begins)
    RESTART = "restart"  # same as START; names an attempt after an interruption
    INITIALISED = "initialised"  # startup done (framework init, communicators, compile)
    RESTORE_START = "restore_start"
    RESTORE_END = "restore_end"
    STEP = "step"  # a training step began (informational: counted, not needed for accounting)
    CHECKPOINT_SAVE_START = "checkpoint_save_start"
    CHECKPOINT_SAVE_END = "checkpoint_save_end"
    CHECKPOINT_PERSISTED = "checkpoint_persisted"
    HEALTH_CHECK_START = "health_check_start"  # an in-job health check pauses training
    HEALTH_CHECK_END = "health_check_end"
    DATA_WAIT_START = "data_wait_start"  # training blocked waiting for the input pipeline
    DATA_WAIT_END = "data_wait_end"
    FAILURE = "failure"  # unexpected interruption (progress stops at this instant)
    MAINTENANCE = "maintenance"  # planned interruption (maintenance, operator action, proactive drain)
    DETECTED = "detected"  # the interruption was noticed (optional; splits detection from waiting)
    END = "end"  # the job (or the observation window) ended


K = TimelineEventKind


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One event. ``cause`` names an interruption's root cause (``gpu``, ``software``, ...);
    ``checkpoint`` pairs an asynchronous save with its ``CHECKPOINT_PERSISTED``; ``step`` is the
    training step for ``STEP`` events."""

    time: float
    kind: TimelineEventKind
    cause: str = ""
    checkpoint: int | None = None
    step: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.time, bool) or not isinstance(self.time, int | float) or not math.isfinite(self.time):
            raise InvalidInput("time", self.time, "a finite number of seconds")


@dataclass(frozen=True, slots=True)
class JobTimeline:
    """A job's events in time order (ties keep the order given)."""

    events: tuple[TimelineEvent, ...] = field(default=())

    def __post_init__(self) -> None:
        for i in range(1, len(self.events)):
            if self.events[i].time < self.events[i - 1].time:
                raise InvalidInput(
                    f"events[{i}].time",
                    self.events[i].time,
                    f"a time >= the previous event's ({self.events[i - 1].time})",
                )

    @classmethod
    def of(cls, events: Iterable[TimelineEvent]) -> JobTimeline:
        """Build from events in any order: sorted by time, ties keep their input order."""
        return cls(tuple(sorted(events, key=lambda e: e.time)))

    @classmethod
    def from_datetimes(
        cls, rows: Sequence[tuple[datetime, TimelineEventKind | str]], *, epoch: datetime | None = None
    ) -> JobTimeline:
        """Build from ``(aware datetime, kind)`` rows; times become seconds since ``epoch`` (default:
        the earliest row)."""
        if not rows:
            return cls()
        for i, (when, _) in enumerate(rows):
            if when.tzinfo is None:
                raise InvalidInput(f"rows[{i}].time", when, "a timezone-aware datetime")
        base = epoch or min(r[0] for r in rows)
        out = []
        for i, (when, kind) in enumerate(rows):
            try:
                k = TimelineEventKind(kind)
            except ValueError:
                raise InvalidInput(f"rows[{i}].kind", kind, f"one of {[m.value for m in K]}") from None
            out.append(TimelineEvent((when - base).total_seconds(), k))
        return cls.of(out)

    def with_event(self, event: TimelineEvent) -> JobTimeline:
        """A copy with ``event`` inserted after every event at the same or an earlier time."""
        i = len(self.events)
        while i > 0 and self.events[i - 1].time > event.time:
            i -= 1
        return JobTimeline((*self.events[:i], event, *self.events[i:]))

    def __len__(self) -> int:
        return len(self.events)
