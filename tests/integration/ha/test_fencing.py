"""Fencing on a real PostgreSQL: a deposed leader's writes are refused, whatever writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, func, select

from gpufleet.controller.ha.fence import Fence, Fenced
from gpufleet.controller.runtime import build
from gpufleet.controller.settings import ControllerSettings, SchedulerKind
from gpufleet.controller.store.db import make_engine
from gpufleet.controller.store.lease import LeaseStore
from gpufleet.controller.store.models import AuditRow
from gpufleet.controller.store.repo import Store
from gpufleet.domain.errors import ExternalError
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.plan import AuditEntry, Plan
from gpufleet.lifecycle.states import Actor, NodeState
from gpufleet.schedulers.sim import SimScheduler

pytestmark = [pytest.mark.ha, pytest.mark.postgres]
LENGTH = timedelta(seconds=8)


class Wall:
    def __init__(self) -> None:
        self.t = datetime(2026, 11, 26, 21, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.t


def plan(detail: str) -> Plan:
    return Plan(audit=[AuditEntry(datetime.now(UTC), Actor.SYSTEM, "test", "note", "fleet", detail)])


def notes(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(select(AuditRow.detail).where(AuditRow.action == "note").order_by(AuditRow.seq)))


def replica(url: str) -> tuple[Engine, Fence, Store]:
    engine = make_engine(url)
    fence = Fence()
    fence.install(engine)
    return engine, fence, Store(engine)


def test_a_deposed_leader_writes_nothing_the_new_one_writes_on(pg_url: str) -> None:
    wall = Wall()
    leases = LeaseStore(make_engine(pg_url), now=wall)
    ea, fa, a = replica(pg_url)
    eb, fb, b = replica(pg_url)
    with pytest.raises(Fenced, match="not the leader"):  # before any election nobody writes
        a.commit(plan("before"))
    lease, mine = leases.ask("a", "http://a", LENGTH)
    assert mine and lease.epoch == 1
    fa.epoch = lease.epoch
    a.commit(plan("a at epoch 1"))
    with pytest.raises(Fenced):
        b.commit(plan("b follows"))
    wall.t += LENGTH  # a stops renewing (paused); its lease runs out and b takes the next epoch
    lease, mine = leases.ask("b", "http://b", LENGTH)
    assert mine and lease.epoch == 2
    fb.epoch = 2
    b.commit(plan("b at epoch 2"))
    with pytest.raises(Fenced, match=r"epoch 1 is stale .*epoch 2"):
        a.commit(plan("a wakes up"))  # the ORM path
    with pytest.raises(Fenced):
        a.record_heartbeats([("n1", datetime.now(UTC), "v")])  # a Core path
    assert notes(ea) == ["a at epoch 1", "b at epoch 2"], "a deposed leader's write landed"
    assert fa.refused == 3 and fb.refused == 1
    assert a.counts()["events"]["total"] == 0  # reads are not fenced
    for e in (ea, eb):
        with e.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(AuditRow)) == 2  # the pool is usable after a refusal
        e.dispose()


def test_a_second_replica_built_on_the_same_database_follows_and_cannot_write(pg_url: str) -> None:
    settings = ControllerSettings(database_url=pg_url, port=0, scheduler=SchedulerKind.SIM)
    fleet = simulated_fleet(4, 2)
    first = build(settings, SimScheduler([n.id for n in fleet]))
    second = build(settings, SimScheduler([n.id for n in fleet]))
    try:
        assert first.leadership.leading() and first.leadership.epoch == 1
        assert not second.leadership.leading()
        assert first.controller.register_fleet(fleet, NodeState.READY) == 4
        with pytest.raises(ExternalError, match="write refused"):
            second.controller.set_dry_run(True, "someone")
        assert second.controller.store.load_settings()[1] is None and not second.controller.dry_run
        first.shutdown()  # resigns: the second takes over at its next try, with the next epoch
        assert second.elector is not None and second.elector.step()
        assert second.leadership.epoch == 2
        assert set(second.controller.states()) == {n.id for n in fleet}, "the new leader rebuilt from the store"
        more = simulated_fleet(6, 2)
        new = {n.id for n in more} - {n.id for n in fleet}
        assert second.controller.register_fleet(more, NodeState.READY) == len(new)
    finally:
        first.shutdown()
        second.shutdown()
