"""The per-rank run log ``gpufleet.goodput/v1``: parsing, restart inference, and the job timeline (pure).

Each rank of a training job appends JSON Lines to its own file (``goodput-rank<R>.jsonl``, written by
:mod:`gpufleet.goodput.durable`). Every process that opens the file first writes an ``attempt`` header;
then one line per event. Times ``t`` are Unix seconds (wall clock anchored once per attempt, advanced
by a monotonic clock). Record kinds and their fields:

==================  ==========================================================================
``attempt``         ``launched`` (when the attempt's processes started), ``rank``, ``world``,
                    ``pid``, ``host``, optional ``job``, ``slurm_step``, ``local_rank``, ``device``
``model``           ``flops_per_step`` (per rank), optional ``peak_flops`` (per rank), ``dtype``
``step``            a *completed* step: ``step``, ``dur`` (begin -> end), optional ``tokens``,
                    ``compute`` (the rank's own compute seconds, for straggler detection)
``data``            the loop waited ``dur`` seconds for input, ending at ``t``
``ckpt_start``      snapshot at a step boundary: ``ckpt`` (id), ``step``, ``async``
``ckpt_end``        training unblocked: ``ckpt``
``ckpt_persisted``  the checkpoint is durable: ``ckpt``, ``step``
``restore_start``   loading a checkpoint
``restore_end``     loaded: ``step`` (the step training continues from)
``failure``         the loop died with an exception: ``cause``
``end``             the loop finished
==================  ==========================================================================

Crash safety: a crash may leave a torn last line; such a line is skipped (and counted) when it is the
file's last or is followed by an ``attempt`` header. Restarts are read two ways: a new ``attempt``
header (a new process), or a step number that repeats within one attempt (an in-process restart). An
attempt that stopped without ``end`` or ``failure`` crashed: a ``failure`` (cause ``unrecorded``) is
placed at its last record.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.timeline import JobTimeline, TimelineEvent, TimelineEventKind

FORMAT = "gpufleet.goodput/v1"
K = TimelineEventKind


class RecordKind(StrEnum):
    ATTEMPT = "attempt"
    MODEL = "model"
    STEP = "step"
    DATA = "data"
    CKPT_START = "ckpt_start"
    CKPT_END = "ckpt_end"
    CKPT_PERSISTED = "ckpt_persisted"
    RESTORE_START = "restore_start"
    RESTORE_END = "restore_end"
    FAILURE = "failure"
    END = "end"


R = RecordKind
_NUM = {"t", "launched", "dur", "compute", "flops_per_step", "peak_flops"}
_INT = {"rank", "world", "pid", "local_rank", "step", "tokens", "ckpt"}
_STR = {"host", "job", "slurm_step", "device", "dtype", "cause", "format"}
_BOOL = {"async"}
_ALLOWED = _NUM | _INT | _STR | _BOOL | {"ev"}


@dataclass(frozen=True, slots=True)
class Record:
    """One line. Unused fields stay None / ""."""

    t: float
    ev: RecordKind
    step: int | None = None
    dur: float | None = None
    ckpt: int | None = None
    tokens: int | None = None
    compute: float | None = None
    cause: str = ""
    is_async: bool = False


@dataclass(frozen=True, slots=True)
class Attempt:
    launched: float
    rank: int
    world: int
    pid: int
    host: str
    job: str = ""
    local_rank: int | None = None
    device: str = ""
    flops_per_step: float | None = None
    peak_flops: float | None = None
    dtype: str = ""
    records: tuple[Record, ...] = ()


@dataclass(frozen=True, slots=True)
class RankLog:
    rank: int
    attempts: tuple[Attempt, ...]
    torn_lines: int = 0

    @property
    def host(self) -> str:
        return self.attempts[-1].host if self.attempts else ""


@dataclass(frozen=True, slots=True)
class Restart:
    """One restart: ``time`` it began, the highest step reached before, the step it resumed from, and
    whether it was read from a repeated step number (no new process)."""

    time: float
    reached: int | None
    resumed: int | None
    inferred: bool

    @property
    def steps_redone(self) -> int:
        if self.reached is None or self.resumed is None:
            return 0
        return max(0, self.reached - self.resumed + 1)


@dataclass(frozen=True, slots=True)
class JobRun:
    """One rank's log read as a job: its timeline (for :func:`gpufleet.goodput.ettr.compute`) and restarts."""

    timeline: JobTimeline
    restarts: tuple[Restart, ...] = field(default=())


def parse_rank_log(text: str, source: str = "run log") -> RankLog:
    """Parse one rank's file; every error names ``<source>:<line>.<field>``."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    torn = 0
    attempts: list[Attempt] = []
    header: dict[str, object] | None = None
    records: list[Record] = []
    extra: dict[str, object] = {}

    def close() -> None:
        if header is not None:
            attempts.append(_attempt(header, extra, records))

    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise ValueError("not an object")
        except ValueError:
            nxt = next((x for x in lines[n:] if x.strip()), None)
            if nxt is None or '"ev": "attempt"' in nxt or '"ev":"attempt"' in nxt:
                torn += 1  # a crash cut this line short
                continue
            raise InvalidInput(where, line[:80], "a JSON object (only a crash's last line may be torn)") from None
        _check_keys(doc, where)
        ev = _kind(doc.get("ev"), f"{where}.ev")
        if ev is R.ATTEMPT:
            close()
            header, records, extra = doc, [], {}
            if doc.get("format", FORMAT) != FORMAT:
                raise InvalidInput(f"{where}.format", doc.get("format"), FORMAT)
            for key in ("launched", "rank", "world"):
                if key not in doc:
                    raise InvalidInput(f"{where}.{key}", None, f"the attempt's {key}")
            continue
        if header is None:
            raise InvalidInput(f"{where}.ev", ev.value, "an 'attempt' header before any other record")
        if ev is R.MODEL:
            extra = {k: doc[k] for k in ("flops_per_step", "peak_flops", "dtype") if k in doc}
            continue
        if "t" not in doc:
            raise InvalidInput(f"{where}.t", None, "the record's time (Unix seconds)")
        if ev in (R.STEP, R.DATA) and "dur" not in doc:
            raise InvalidInput(f"{where}.dur", None, "the duration in seconds")
        if ev is R.STEP and "step" not in doc:
            raise InvalidInput(f"{where}.step", None, "the step number")
        records.append(Record(float(doc["t"]), ev, _opt_int(doc, "step"), _opt_num(doc, "dur"),
                              _opt_int(doc, "ckpt"), _opt_int(doc, "tokens"), _opt_num(doc, "compute"),
                              str(doc.get("cause", "")), bool(doc.get("async", False))))
    close()
    if not attempts:
        raise InvalidInput(f"{source}", "empty", "at least one 'attempt' header")
    ranks = {a.rank for a in attempts}
    if len(ranks) != 1:
        raise InvalidInput(f"{source}.rank", sorted(ranks), "one rank per file")
    return RankLog(attempts[0].rank, tuple(attempts), torn)


def job_run(log: RankLog) -> JobRun:
    """Read one rank's attempts as a job timeline, inferring crashes and restarts."""
    events: list[TimelineEvent] = []
    restarts: list[Restart] = []
    last = -math.inf
    reached: int | None = None  # highest step completed so far
    for i, att in enumerate(log.attempts):
        shift = max(0.0, last - att.launched)  # another node's clock may lag; never go backwards
        recs = [_shifted(r, shift) for r in att.records]
        launched = att.launched + shift
        if i > 0:
            prev = log.attempts[i - 1].records
            if not prev or prev[-1].ev not in (R.END, R.FAILURE):
                events.append(TimelineEvent(last, K.FAILURE, "unrecorded"))
            restarts.append(Restart(launched, reached, _first_step(recs), inferred=False))
        events.append(TimelineEvent(launched, K.RESTART if i else K.START))
        last = launched
        cuts = _in_process_restarts(recs)  # index where a restart begins -> its repeated step's index
        for j, rec in enumerate(recs):
            if j in cuts:
                at = _begin(rec)
                events.append(TimelineEvent(at, K.FAILURE, "unrecorded"))
                events.append(TimelineEvent(at, K.RESTART))
                restarts.append(Restart(at, reached, recs[cuts[j]].step, inferred=True))
            events.extend(_timeline_events(rec, recs, j))
            if rec.ev is R.STEP and rec.step is not None:
                reached = rec.step if reached is None else max(reached, rec.step)
            last = max(last, rec.t)
    return JobRun(JobTimeline.of(events), tuple(restarts))


def _in_process_restarts(recs: list[Record]) -> dict[int, int]:
    """Steps whose number repeats within one attempt: {where the restart begins: the step's index}.
    The restart begins before the restore and data records that lead to the repeated step."""
    cuts: dict[int, int] = {}
    seen: int | None = None
    for j, rec in enumerate(recs):
        if rec.ev is not R.STEP or rec.step is None:
            continue
        if seen is not None and rec.step <= seen:
            k = j
            while k > 0 and recs[k - 1].ev in (R.RESTORE_START, R.RESTORE_END, R.DATA):
                k -= 1
            cuts[k] = j
            seen = rec.step
        else:
            seen = rec.step if seen is None else max(seen, rec.step)
    return cuts


def _begin(rec: Record) -> float:
    return rec.t - (rec.dur or 0.0) if rec.ev in (R.STEP, R.DATA) else rec.t


def _timeline_events(rec: Record, recs: list[Record], j: int) -> Iterable[TimelineEvent]:
    ev = rec.ev
    if ev is R.STEP:
        yield TimelineEvent(rec.t - (rec.dur or 0.0), K.STEP, step=rec.step)
    elif ev is R.DATA:
        yield TimelineEvent(rec.t - (rec.dur or 0.0), K.DATA_WAIT_START)
        yield TimelineEvent(rec.t, K.DATA_WAIT_END)
    elif ev is R.CKPT_START:
        yield TimelineEvent(rec.t, K.CHECKPOINT_SAVE_START, checkpoint=rec.ckpt if rec.is_async else None)
    elif ev is R.CKPT_END:
        sync = any(r.ev is R.CKPT_START and r.ckpt == rec.ckpt and not r.is_async for r in recs[:j])
        yield TimelineEvent(rec.t, K.CHECKPOINT_SAVE_END, checkpoint=None if sync else rec.ckpt)
    elif ev is R.CKPT_PERSISTED:
        if any(r.ev is R.CKPT_START and r.ckpt == rec.ckpt and r.is_async for r in recs[:j]):
            yield TimelineEvent(rec.t, K.CHECKPOINT_PERSISTED, checkpoint=rec.ckpt)
    elif ev is R.RESTORE_START:
        yield TimelineEvent(rec.t, K.RESTORE_START)
    elif ev is R.RESTORE_END:
        yield TimelineEvent(rec.t, K.RESTORE_END)
    elif ev is R.FAILURE:
        yield TimelineEvent(rec.t, K.FAILURE, rec.cause or "unknown")
    elif ev is R.END:
        yield TimelineEvent(rec.t, K.END)


def _first_step(recs: list[Record]) -> int | None:
    return next((r.step for r in recs if r.ev is R.STEP), None)


def _shifted(r: Record, shift: float) -> Record:
    if not shift:
        return r
    return Record(r.t + shift, r.ev, r.step, r.dur, r.ckpt, r.tokens, r.compute, r.cause, r.is_async)


def _attempt(h: dict[str, object], extra: dict[str, object], records: list[Record]) -> Attempt:
    def num(key: str) -> float | None:
        v = extra.get(key)
        return float(v) if isinstance(v, int | float) else None

    lr, pid = h.get("local_rank"), h.get("pid", 0)
    launched, rank, world = h["launched"], h["rank"], h["world"]
    assert isinstance(launched, int | float) and isinstance(rank, int) and isinstance(world, int)  # _check_keys
    return Attempt(float(launched), rank, world, pid if isinstance(pid, int) else 0, str(h.get("host", "")),
                   str(h.get("job", "")), lr if isinstance(lr, int) else None, str(h.get("device", "")),
                   num("flops_per_step"), num("peak_flops"), str(extra.get("dtype", "")), tuple(records))


def _check_keys(doc: dict[str, object], where: str) -> None:
    for key, value in doc.items():
        if key not in _ALLOWED:
            raise InvalidInput(f"{where}.{key}", value, f"only {sorted(_ALLOWED)}")
        if key in _NUM and (isinstance(value, bool) or not isinstance(value, int | float)
                            or not math.isfinite(value) or value < 0):
            raise InvalidInput(f"{where}.{key}", value, "a finite number >= 0")
        if key in _INT and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidInput(f"{where}.{key}", value, "an integer >= 0")
        if key in _STR and not isinstance(value, str):
            raise InvalidInput(f"{where}.{key}", value, "a string")
        if key in _BOOL and not isinstance(value, bool):
            raise InvalidInput(f"{where}.{key}", value, "true or false")


def _kind(value: object, where: str) -> RecordKind:
    try:
        return RecordKind(str(value))
    except ValueError:
        raise InvalidInput(where, value, f"one of {[k.value for k in RecordKind]}") from None


def _opt_int(doc: dict[str, object], key: str) -> int | None:
    v = doc.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _opt_num(doc: dict[str, object], key: str) -> float | None:
    v = doc.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
