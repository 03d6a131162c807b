"""The goodput interval store on both databases: idempotent by (job, run, start), all or nothing, and the
range query the roll-up reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from gpufleet.controller.store.goodput import GoodputStore
from gpufleet.controller.store.repo import Store
from gpufleet.domain.errors import Conflict
from gpufleet.goodput.ettr import Badput
from gpufleet.goodput.rollup import JobInterval

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def _iv(job: str, minute: int, productive: float = 59.5, flops: float | None = 1.0e17 / 3) -> JobInterval:
    start = T0 + timedelta(minutes=minute)
    return JobInterval(job, "run-1", start, start + timedelta(minutes=1), productive,
                       Badput(startup=60 - productive), 10, 55.1, flops, 989.4e12, 16)


def test_the_same_interval_twice_is_a_duplicate_and_other_values_a_conflict(engine: Engine) -> None:
    gs = GoodputStore(Store(engine))
    assert gs.add([_iv("j1", 0), _iv("j1", 1)], T0)[:2] == (2, 0)
    assert gs.add([_iv("j1", 1), _iv("j1", 2)], T0)[:2] == (1, 1)  # floats read back equal on both databases
    with pytest.raises(Conflict):
        gs.add([_iv("j1", 3), _iv("j1", 0, productive=30)], T0)
    assert [i.start for i in gs.of_job("j1")] == [T0 + timedelta(minutes=m) for m in range(3)]
    assert gs.of_job("j1")[0] == _iv("j1", 0)


def test_the_range_query_returns_overlapping_intervals_and_says_when_it_stopped(engine: Engine) -> None:
    gs = GoodputStore(Store(engine))
    gs.add([_iv("j1", m) for m in range(5)] + [_iv("j2", 2, flops=None)], T0)
    rows, more = gs.in_range(T0 + timedelta(minutes=1, seconds=30), T0 + timedelta(minutes=3))
    assert sorted((i.job, i.start.minute) for i in rows) == [("j1", 1), ("j1", 2), ("j2", 2)]
    assert more is False
    rows, more = gs.in_range(T0, T0 + timedelta(hours=1), limit=4)
    assert len(rows) == 4 and more is True
    assert gs.span("j1") == (T0, T0 + timedelta(minutes=5))
    assert gs.span("nope") is None
    assert gs.recent_jobs(1) == [("j1", T0 + timedelta(minutes=5))]
