"""Fleet-sized lists reach the database within its limits, on both databases.

PostgreSQL binds at most 65,535 parameters to one statement ("number of parameters must be between 0
and 65535"); SQLite's default build 32,766 ("too many SQL variables"; Debian's builds allow more, so the
SQLite runs set the default limit on every connection). A scheduler lists 100,000 jobs and a tenant
can own most of a 20,000-node fleet: 70,000 keys are over both limits.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select
from sqlalchemy import event as sa_event

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.retention import Retention
from gpufleet.controller.store.db import make_engine
from gpufleet.controller.store.models import BundleRow
from gpufleet.controller.store.repo import Page, Store
from gpufleet.controller.store.tenancy import Move, TenancyStore
from gpufleet.lifecycle.plan import AuditEntry, Plan
from gpufleet.lifecycle.states import Actor
from tests.integration.store.plans import drain_plan, event, node_record

T0 = datetime(2026, 3, 1, tzinfo=UTC)
MANY = 70_000  # over PostgreSQL's 65,535 and SQLite's default 32,766
SQLITE_DEFAULT_MAX_VARIABLES = 32_766


@pytest.fixture
def limited(db_url: str) -> Iterator[Engine]:
    """An engine whose SQLite connections refuse more variables than SQLite's default build does."""
    eng = make_engine(db_url)
    if eng.dialect.name == "sqlite":
        @sa_event.listens_for(eng, "connect")
        def _limit(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_DEFAULT_MAX_VARIABLES)
    yield eng
    eng.dispose()


def test_checkpoints_of_a_schedulers_whole_queue_are_read(limited: Engine) -> None:
    store = Store(limited)
    jobs = [str(100_000 + i) for i in range(MANY)]
    store.add_checkpoint(jobs[0], T0, T0)
    store.add_checkpoint(jobs[MANY // 2], T0 + timedelta(hours=1), T0)
    store.add_checkpoint(jobs[-1], T0 + timedelta(hours=2), T0)
    store.add_checkpoint("not-asked", T0 + timedelta(hours=3), T0)

    assert store.last_checkpoints(jobs) == {jobs[0]: T0, jobs[MANY // 2]: T0 + timedelta(hours=1),
                                            jobs[-1]: T0 + timedelta(hours=2)}
    assert store.last_checkpoint(jobs) == T0 + timedelta(hours=2)
    assert store.last_checkpoints([*jobs[1:10], jobs[1]]) == {} and store.last_checkpoint(jobs[1:10]) is None
    assert store.last_checkpoints([]) == {} and store.last_checkpoint([]) is None


def test_listings_scoped_to_a_tenant_owning_most_of_the_fleet_are_paged(limited: Engine) -> None:
    store = Store(limited)
    mine, other = ["r01-n01", "r01-n02", "r01-n03"], "r02-n01"
    store.commit(Plan(), new_nodes=[(node_record(n), n[:3], T0) for n in (*mine, other)],
                 events=[event(f"e{i}", node=n) for i, n in enumerate((*mine, other))], received=T0)
    store.commit(drain_plan(mine[1], "d-mine"))
    store.commit(drain_plan(other, "d-other"))
    tenancy = TenancyStore(store)
    for n in (mine[0], other):
        tenancy.begin(Move(f"t-{n}", n, None, "acme", f"m-{n}", "running", "draining", "admin:root", T0, T0),
                      AuditEntry(T0, Actor.OPERATOR, "admin:root", "tenancy_move", n, "move"))
    within = frozenset({*mine, *(f"r{9_000 + i}-n01" for i in range(MANY))})  # registered or not

    assert [r.id for r in store.nodes(within=within)] == mine
    assert [r.id for r in store.nodes(within=within, page=Page(2, 1))] == mine[1:]
    assert [r.node for r in store.events(within=within)] == mine[::-1]  # newest first, same time: by seq
    assert sorted(r.target for r in store.audit(within=within)) == [mine[0], mine[1]]
    assert [d.id for d in store.decisions(within=within)] == ["d-mine"]
    assert {a.node for a in store.actions(within=within)} == {mine[1]} and len(store.actions(within=within)) == 2
    assert [m.node for m in tenancy.moves(nodes=within)] == [mine[0]]
    assert [r.id for r in store.nodes(within=frozenset())] == [] and tenancy.moves(nodes=()) == []


def test_retention_deletes_more_old_bundles_than_one_statement_binds(limited: Engine) -> None:
    store = Store(limited)
    now = T0 + timedelta(days=400)
    rows = [{"id": f"a{i}:bundle", "node": "n1", "action_id": f"a{i}", "created": T0, "size": 1, "sha256": "0",
             "summary": "", "data": b"x"} for i in range(MANY)]
    rows.append({**rows[0], "id": "recent:bundle", "created": now - timedelta(days=1)})
    with store.session.begin() as s:
        s.execute(insert(BundleRow), rows)
    r = Retention(store, ManualClock(now), timedelta(0), bundles=timedelta(days=90))
    r.run_once()
    with store.session() as s:
        assert list(s.scalars(select(BundleRow.id))) == ["recent:bundle"]
        assert s.scalar(select(func.count()).select_from(BundleRow)) == 1
    assert r.bundles_deleted == MANY
