"""Events: the producer's id is the dedup key, in the database and through the controller."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import IntegrityError

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.models import EventRow
from gpufleet.controller.store.repo import Store
from gpufleet.domain.events import EventKind
from gpufleet.domain.fleet import Node
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.plan import Plan
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0, event, node_record


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(EventRow)).scalar_one())


def test_the_database_refuses_a_second_copy_of_an_event(engine: Engine) -> None:
    store = Store(engine)
    store.commit(Plan(), new_nodes=[(node_record("r01-n01"), "r01", T0)], events=[event("e1")], received=T0)
    with pytest.raises(IntegrityError):
        store.commit(Plan(), events=[event("e1", at=T0 + timedelta(seconds=1))], received=T0)
    assert _count(engine) == 1


def test_known_event_ids_finds_exactly_the_stored_ones_across_chunks(engine: Engine) -> None:
    store = Store(engine)
    stored = [event(f"e{i:05d}", kind=EventKind.ECC_SBE, code=None, at=T0 + timedelta(milliseconds=i))
              for i in range(0, 2400, 2)]  # 1,200 even ids: more than two query chunks
    store.commit(Plan(), new_nodes=[(node_record("r01-n01"), "r01", T0)], events=stored, received=T0)
    asked = [("r01-n01", f"e{i:05d}") for i in range(2400)]
    assert store.known_event_ids(asked) == {(e.node, e.id) for e in stored}
    # ids are scoped to their node: another node's event with the same id is not stored
    assert store.known_event_ids([("r01-n02", "e00000"), ("r01-n01", "e00000")]) == {("r01-n01", "e00000")}
    assert store.known_event_ids([]) == set()


def test_controller_stores_a_resent_batch_once(engine: Engine) -> None:
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock)
    c.register([Node("r01-n01", "r01"), Node("r01-n02", "r01")], state=NodeState.READY)
    at = clock.advance(timedelta(seconds=10))
    batch = [event("a1", "r01-n01", kind=EventKind.ECC_SBE, code=None, at=at),
             event("a2", "r01-n02", kind=EventKind.XID, code=13, at=at),
             event("a3", "r01-n01", kind=EventKind.XID, code=79, at=at)]
    first = c.ingest(batch)
    assert (first.accepted, first.duplicates, first.decisions) == (3, 0, 1)
    decisions = len(c.store.decisions())

    clock.advance(timedelta(seconds=30))
    again = c.ingest(batch)
    assert (again.accepted, again.duplicates, again.decisions) == (0, 3, 0)
    overlap = c.ingest([batch[0], event("a4", "r01-n02", kind=EventKind.ECC_SBE, code=None, at=at)])
    assert (overlap.accepted, overlap.duplicates) == (1, 1)
    assert _count(engine) == 4
    assert len(c.store.decisions()) == decisions
    stored = {r.id: r for r in c.store.events()}
    assert stored["a1"].received == at  # the first copy is the one kept
