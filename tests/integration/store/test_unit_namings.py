"""Repeat offenders across a controller restart (issue #14 item 5): a unit named by a verdict,
moved to another slot (its tray/GPU serial reported there), and named again days later is flagged
for replacement — the history lives in the database, not in the 30-minute correlation window."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine
from gpufleet.controller.store.namings import NamingStore
from gpufleet.controller.store.repo import Page, Store
from gpufleet.correlate.model import SuspectAction
from gpufleet.correlate.offenders import Naming
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import to_fleet
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0
from tests.inventories import swap_reports


def test_namings_are_kept_once_and_read_back_in_time_order(engine: Engine) -> None:
    h = NamingStore(Store(engine))
    late = Naming("SN-1", "r01-n01-gpu2", "gpu", T0 + timedelta(days=2))
    early = Naming("SN-1", "r02-n01-gpu0", "gpu", T0)
    for n in (late, early, late):  # a replayed window records the same naming again
        h.record(n)
    h.record(Naming("SN-2", "r01-n01-gpu3", "gpu", T0))
    assert h.named("SN-1", T0 - timedelta(days=1)) == [early, late]
    assert h.named("SN-1", T0 + timedelta(days=1)) == [late]
    assert h.named("SN-9", T0) == []


def _xid79(node: str, gpu: str, at: timedelta, tag: str) -> HealthEvent:
    return HealthEvent(f"x79-{tag}", node, EventKind.XID, T0 + at, gpu, code=79)


def test_a_unit_that_fails_again_in_another_slot_after_a_restart_is_a_repeat_offender(
    engine: Engine, db_url: str
) -> None:
    topo = generate_hgx(16)
    a, b = "r01-n02-gpu3", "r03-n01-gpu5"
    serial = topo.components[a].serial
    assert serial
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock, topology=topo)
    c.register_fleet(to_fleet(topo), NodeState.READY)
    c.ingest([_xid79("r01-n02", a, timedelta(seconds=5), "first")])
    assert any(s.component == a and not s.repeats for s in c.verdicts)
    # Repaired and reseated elsewhere: the two nodes' agents report the GPUs swapped.
    clock.advance(timedelta(days=1))
    for report in swap_reports(topo, a, b):
        assert c.register_inventory(report)
    clock.advance(timedelta(days=2))
    other = make_engine(db_url)  # a new controller process: only the database remembers
    try:
        again = Controller(Store(other), load_policy(), clock, topology=topo)
        again.ingest([_xid79("r03-n01", b, timedelta(days=3, seconds=10), "second")])
        named = {s.component: s for s in again.verdicts}
        assert b in named, again.verdicts
        s = named[b]
        assert s.serial == serial and s.repeats == 1 and s.action is SuspectAction.DRAIN_AND_REPLACE
        assert a in s.reason and "repeat offender" in s.reason
        audit = [e for e in again.store.audit(page=Page(limit=100)) if e.action == "repeat_offender"]
        assert [e.target for e in audit] == [b]
        # The unit now at the old slot failing is a different unit: not a repeat offender.
        again.ingest([_xid79("r01-n02", a, timedelta(days=3, seconds=20), "third")])
        assert {s.component: s for s in again.verdicts}[a].repeats == 0
    finally:
        other.dispose()
