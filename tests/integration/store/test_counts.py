"""The status page's counts at fleet volume: count(*) over the events table reads all of it, so past a
million rows PostgreSQL's own estimate answers (bench/bench_store_plans.py measured the scans)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, text

from gpufleet.controller.store import repo
from gpufleet.controller.store.repo import Store
from gpufleet.domain.events import EventKind, HealthEvent
from tests.integration.store.plans import T0


def _store_events(store: Store, n: int) -> None:
    events = [HealthEvent(f"e{i}", f"n{i % 7}", EventKind.XID, T0 + timedelta(seconds=i), code=79) for i in range(n)]
    with store.round() as tx:
        assert len(tx.insert_events(events, T0)) == n


def test_counts_are_exact_on_a_small_table_and_the_probe_counts_nodes_only(engine: Engine) -> None:
    store = Store(engine)
    _store_events(store, 40)
    assert store.counts()["events"]["total"] == 40
    assert store.node_count() == 0  # no node registered: the probe never touched the events


def test_past_the_threshold_postgresql_answers_with_its_estimate(engine: Engine,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(engine)
    _store_events(store, 300)
    monkeypatch.setattr(repo, "_EXACT_COUNT_UP_TO", 100)
    if engine.dialect.name != "postgresql":
        assert store.counts()["events"]["total"] == 300  # SQLite: always exact (small by design)
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE events"))
        estimate = conn.execute(text("SELECT reltuples::bigint FROM pg_class WHERE oid = 'events'::regclass")).scalar()
    assert estimate == 300  # ANALYZE of a small table counts it
    more = [HealthEvent(f"x{i}", "n1", EventKind.XID, T0, code=79) for i in range(5)]
    with store.round() as tx:
        tx.insert_events(more, T0)
    assert store.counts()["events"]["total"] == 300  # the estimate, not a scan (305 rows now)
