"""Goodput intervals jobs reported (table ``goodput_intervals``, migration 0005).

An interval is final when a job reports it (docs/goodput.md), so its key ``(job, run, start)`` is an
idempotency key: the same interval again is a duplicate (nothing changes), a different interval under
a stored key is a Conflict (409) — the same convention as event ids. A batch is all or nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select, tuple_
from sqlalchemy.exc import IntegrityError

from gpufleet.domain.errors import Conflict
from gpufleet.goodput.ettr import Badput
from gpufleet.goodput.rollup import CATEGORIES, JobInterval

from .keys import chunks
from .models import GoodputIntervalRow
from .repo import Page, Store

MAX_ROWS_IN_RANGE = 100_000  # the roll-up reads at most this many intervals (it says when it stopped there)


def _interval(r: GoodputIntervalRow) -> JobInterval:
    b = r.badput or {}
    return JobInterval(r.job_id, r.run, r.start, r.end, r.productive,
                       Badput(**{k: float(b.get(k, 0.0)) for k in CATEGORIES}), r.steps, r.step_s, r.flops,
                       r.peak_flops, r.world)


def _same(a: JobInterval, b: JobInterval) -> bool:
    """Equal as reported (floats compared to a relative 1e-9: a database may round the last bit)."""
    def close(x: float | None, y: float | None) -> bool:
        return x == y or (x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9))
    return (a.end == b.end and a.steps == b.steps and a.world == b.world and close(a.productive, b.productive)
            and close(a.step_s, b.step_s) and close(a.flops, b.flops) and close(a.peak_flops, b.peak_flops)
            and all(close(x, y) for x, y in zip(a.badput.as_dict().values(), b.badput.as_dict().values(),
                                                strict=True)))


class GoodputStore:
    def __init__(self, store: Store) -> None:
        self.session = store.session

    def add(self, intervals: Sequence[JobInterval], received: datetime) -> tuple[int, int, list[JobInterval]]:
        """Store new intervals; returns (accepted, duplicates, the intervals newly stored). Conflict
        (nothing stored) when a key is stored with other values, or repeated with other values in the batch."""
        batch: dict[tuple[str, str, datetime], JobInterval] = {}
        for i in intervals:
            key = (i.job, i.run, i.start)
            if key in batch and not _same(batch[key], i):
                raise Conflict(f"goodput interval {i.job}/{i.run or '-'} at {i.start.isoformat()} given twice "
                               "with different values in one batch")
            batch[key] = i
        for _ in range(2):  # a concurrent writer may insert the same key between our read and write
            try:
                return self._add(batch, received, len(intervals))
            except IntegrityError:
                continue
        return self._add(batch, received, len(intervals))

    def _add(self, batch: dict[tuple[str, str, datetime], JobInterval], received: datetime,
             sent: int) -> tuple[int, int, list[JobInterval]]:
        with self.session.begin() as s:
            stored: dict[tuple[str, str, datetime], JobInterval] = {}
            keys = list(batch)
            for chunk in chunks(keys):
                q = select(GoodputIntervalRow).where(
                    tuple_(GoodputIntervalRow.job_id, GoodputIntervalRow.run, GoodputIntervalRow.start).in_(chunk))
                for r in s.scalars(q):
                    stored[(r.job_id, r.run, r.start)] = _interval(r)
            for key, old in stored.items():
                if not _same(old, batch[key]):
                    raise Conflict(f"goodput interval {key[0]}/{key[1] or '-'} at {key[2].isoformat()} is stored "
                                   "with other values (an interval is final once reported)")
            new = [i for k, i in batch.items() if k not in stored]
            s.add_all(GoodputIntervalRow(
                job_id=i.job, run=i.run, start=i.start, end=i.end, productive=i.productive,
                badput=i.badput.as_dict(), steps=i.steps, step_s=i.step_s, flops=i.flops, peak_flops=i.peak_flops,
                world=i.world, received=received) for i in new)
            return len(new), sent - len(new), new

    def of_job(self, job: str, page: Page | None = None) -> list[JobInterval]:
        """A job's intervals, oldest first."""
        page = page or Page()
        q = (select(GoodputIntervalRow).where(GoodputIntervalRow.job_id == job)
             .order_by(GoodputIntervalRow.start, GoodputIntervalRow.run).limit(page.limit).offset(page.offset))
        with self.session() as s:
            return [_interval(r) for r in s.scalars(q)]

    def latest_of_job(self, job: str, limit: int) -> list[JobInterval]:
        """A job's ``limit`` newest intervals, oldest first."""
        q = (select(GoodputIntervalRow).where(GoodputIntervalRow.job_id == job)
             .order_by(GoodputIntervalRow.start.desc(), GoodputIntervalRow.run).limit(limit))
        with self.session() as s:
            return [_interval(r) for r in s.scalars(q)][::-1]

    def in_range(self, since: datetime, until: datetime, jobs: Sequence[str] | None = None,
                 limit: int = MAX_ROWS_IN_RANGE) -> tuple[list[JobInterval], bool]:
        """The intervals overlapping ``[since, until)`` (of ``jobs`` when given), newest first, at most
        ``limit``; and whether there were more."""
        q = select(GoodputIntervalRow).where(GoodputIntervalRow.end > since, GoodputIntervalRow.start < until)
        if jobs is not None:
            q = q.where(GoodputIntervalRow.job_id.in_(list(jobs)))
        q = q.order_by(GoodputIntervalRow.end.desc(), GoodputIntervalRow.seq.desc()).limit(limit + 1)
        with self.session() as s:
            rows = [_interval(r) for r in s.scalars(q)]
        return rows[:limit], len(rows) > limit

    def span(self, job: str) -> tuple[datetime, datetime] | None:
        """The first start and the last end of a job's intervals (None when it reported none)."""
        q = select(func.min(GoodputIntervalRow.start), func.max(GoodputIntervalRow.end)).where(
            GoodputIntervalRow.job_id == job)
        with self.session() as s:
            row = s.execute(q).one()
        return None if row[0] is None else (row[0], row[1])

    def recent_jobs(self, limit: int) -> list[tuple[str, datetime]]:
        """The ``limit`` jobs that reported most recently, with their last interval's end, newest first."""
        q = (select(GoodputIntervalRow.job_id, func.max(GoodputIntervalRow.end).label("last"))
             .group_by(GoodputIntervalRow.job_id).order_by(func.max(GoodputIntervalRow.end).desc()).limit(limit))
        with self.session() as s:
            return [(j, t) for j, t in s.execute(q)]
