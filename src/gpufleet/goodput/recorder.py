"""Recording a job's timeline as it runs, and its JSON Lines form (``gpufleet.timeline/v1``).

A training loop (or a simulator) holds one :class:`Recorder` with an injected clock::

    rec = Recorder(clock=time.monotonic)        # any float-seconds clock
    rec.start(); ...; rec.initialised()
    rec.checkpoint_start(); save(); rec.checkpoint_end()
    rec.failure("gpu"); ...; rec.end()
    report = rec.report()                        # goodput.ettr.GoodputReport

JSON Lines: one object per event, ``{"time": <seconds>, "kind": "<kind>"}`` plus optional ``cause``,
``checkpoint`` and ``step``; ``time`` may also be an ISO 8601 time with a zone (converted to seconds
since the first event's time).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.ettr import GoodputReport, compute
from gpufleet.goodput.timeline import JobTimeline, TimelineEvent, TimelineEventKind

K = TimelineEventKind
FORMAT = "gpufleet.timeline/v1"


class Recorder:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._events: list[TimelineEvent] = []

    def record(self, kind: TimelineEventKind, *, cause: str = "", checkpoint: int | None = None,
               step: int | None = None) -> TimelineEvent:
        now = float(self._clock())
        if self._events and now < self._events[-1].time:
            raise InvalidInput("clock", now, f"a time >= the previous event's ({self._events[-1].time})")
        ev = TimelineEvent(now, kind, cause, checkpoint, step)
        self._events.append(ev)
        return ev

    def submit(self) -> None:
        self.record(K.SUBMIT)

    def start(self) -> None:
        self.record(K.RESTART if any(e.kind in (K.START, K.RESTART) for e in self._events) else K.START)

    def initialised(self) -> None:
        self.record(K.INITIALISED)

    def step(self, step: int) -> None:
        self.record(K.STEP, step=step)

    def restore_start(self) -> None:
        self.record(K.RESTORE_START)

    def restore_end(self) -> None:
        self.record(K.RESTORE_END)

    def checkpoint_start(self, checkpoint: int | None = None) -> None:
        """Snapshot taken; ``checkpoint`` set for an asynchronous save (durable at ``persisted``)."""
        self.record(K.CHECKPOINT_SAVE_START, checkpoint=checkpoint)

    def checkpoint_end(self, checkpoint: int | None = None) -> None:
        self.record(K.CHECKPOINT_SAVE_END, checkpoint=checkpoint)

    def checkpoint_persisted(self, checkpoint: int) -> None:
        self.record(K.CHECKPOINT_PERSISTED, checkpoint=checkpoint)

    def failure(self, cause: str) -> None:
        self.record(K.FAILURE, cause=cause)

    def maintenance(self, cause: str = "planned") -> None:
        self.record(K.MAINTENANCE, cause=cause)

    def detected(self) -> None:
        self.record(K.DETECTED)

    def end(self) -> None:
        self.record(K.END)

    def timeline(self) -> JobTimeline:
        return JobTimeline(tuple(self._events))

    def report(self) -> GoodputReport:
        return compute(self.timeline())


def to_jsonl(timeline: JobTimeline) -> str:
    lines = []
    for e in timeline.events:
        doc: dict[str, Any] = {"time": e.time, "kind": e.kind.value}
        if e.cause:
            doc["cause"] = e.cause
        if e.checkpoint is not None:
            doc["checkpoint"] = e.checkpoint
        if e.step is not None:
            doc["step"] = e.step
        lines.append(json.dumps(doc))
    return "\n".join(lines) + ("\n" if lines else "")


def parse_jsonl(text: str, source: str = "timeline") -> JobTimeline:
    """Parse ``gpufleet.timeline/v1`` lines (blank lines skipped); every problem names its line."""
    rows: list[tuple[float | datetime, K, str, int | None, int | None]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidInput(where, line[:80], f"a JSON object ({err.msg})") from None
        if not isinstance(doc, dict):
            raise InvalidInput(where, doc, "a JSON object")
        extra = set(doc) - {"time", "kind", "cause", "checkpoint", "step"}
        if extra:
            raise InvalidInput(f"{where}.{sorted(extra)[0]}", doc[sorted(extra)[0]],
                               "only time, kind, cause, checkpoint, step")
        try:
            kind = K(str(doc.get("kind")))
        except ValueError:
            raise InvalidInput(f"{where}.kind", doc.get("kind"), f"one of {[k.value for k in K]}") from None
        rows.append((_time(doc.get("time"), f"{where}.time"), kind, _str(doc.get("cause", ""), f"{where}.cause"),
                     _int(doc.get("checkpoint"), f"{where}.checkpoint"), _int(doc.get("step"), f"{where}.step")))
    if not rows:
        return JobTimeline()
    stamps = [r[0] for r in rows]
    dates = [s for s in stamps if isinstance(s, datetime)]
    numbers = [s for s in stamps if not isinstance(s, datetime)]
    if dates and numbers:
        raise InvalidInput(f"{source}.time", "mixed", "all numbers (seconds) or all ISO 8601 times")
    secs = [(d - dates[0]).total_seconds() for d in dates] if dates else [float(x) for x in numbers]
    events = [TimelineEvent(t, r[1], r[2], r[3], r[4]) for t, r in zip(secs, rows, strict=True)]
    return JobTimeline.of(events)


def _time(value: object, field: str) -> float | datetime:
    if isinstance(value, bool):
        raise InvalidInput(field, value, "seconds or an ISO 8601 time with a zone")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput(field, value, "seconds or an ISO 8601 time with a zone") from None
        if when.tzinfo is None:
            raise InvalidInput(field, value, "an ISO 8601 time with a zone (e.g. 2026-11-21T12:00:00Z)")
        return when
    raise InvalidInput(field, value, "seconds or an ISO 8601 time with a zone")


def _str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(field, value, "a string")
    return value


def _int(value: object, field: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, value, "an integer")
    return value
