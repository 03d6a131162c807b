"""A plan — events, decisions, transitions, outbox actions, audit lines, settings and node rows — is
written in ONE transaction: all of it becomes visible, or (when any part fails) none of it."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from gpufleet.controller.store.db import make_engine
from gpufleet.controller.store.models import (
    ActionRow,
    AuditRow,
    DecisionRow,
    EventRow,
    NodeRow,
    SettingRow,
    TransitionRow,
)
from gpufleet.controller.store.repo import ActionStatus, Store
from gpufleet.lifecycle.breaker import BreakerState
from gpufleet.lifecycle.plan import Plan
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0, drain_plan, event, node_record

_TABLES = (NodeRow, EventRow, DecisionRow, TransitionRow, ActionRow, AuditRow, SettingRow)


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, read through a separate engine (what another process would see)."""
    eng = make_engine(url)
    try:
        out: dict[str, list[tuple[Any, ...]]] = {}
        with eng.connect() as conn:
            for model in _TABLES:
                cols = list(model.__table__.columns)
                rows = conn.execute(select(*cols)).all()
                out[model.__tablename__] = sorted(tuple(repr(v) for v in r) for r in rows)
        return out
    finally:
        eng.dispose()


def _seed(store: Store) -> None:
    """A registered node r01-n01 and one stored event e0."""
    store.commit(Plan(), new_nodes=[(node_record("r01-n01"), "r01", T0)], events=[event("e0")], received=T0)


def test_a_plan_is_written_whole(engine: Engine, db_url: str) -> None:
    store = Store(engine)
    _seed(store)
    plan = drain_plan("r01-n01", "d-1")
    later = T0 + timedelta(seconds=5)
    store.commit(plan, events=[event("e1", at=later)], received=later,
                 nodes=[node_record("r01-n01", NodeState.DRAINING, later)],
                 new_nodes=[(node_record("r01-n02"), "r01", later)])

    snap = snapshot(db_url)
    assert len(snap["events"]) == 2
    assert len(snap["nodes"]) == 2
    assert len(snap["decisions"]) == 1
    assert len(snap["transitions"]) == 1
    assert len(snap["actions"]) == 2
    assert len(snap["audit"]) == 1
    node = store.node("r01-n01")
    assert node is not None
    assert (node.state, node.since) == ("draining", later)
    actions = store.actions()
    assert {a.id for a in actions} == {"d-1:drain", "d-1:requeue_jobs"}
    assert all(a.status == ActionStatus.PENDING and a.attempts == 0 and a.next_attempt == a.created
               for a in actions)
    breaker, dry_run = store.load_settings()
    assert breaker == BreakerState(True, "fleet budget: test", T0)
    assert dry_run is True
    (t,) = store.transitions("r01-n01")
    assert (t.from_state, t.to_state, t.decision_id, t.evidence) == ("ready", "draining", "d-1", ["e1"])


def _dup_event(plan: Plan) -> dict[str, Any]:
    # events[1] repeats the id of an event already stored: a unique-constraint violation.
    return {"events": [event("e-new"), event("e0")]}


def _dup_node(plan: Plan) -> dict[str, Any]:
    # new_nodes[1] is a node that is already registered: a primary-key violation.
    return {"new_nodes": [(node_record("r01-n02"), "r01", T0), (node_record("r01-n01"), "r01", T0)]}


def _null_decision(plan: Plan) -> dict[str, Any]:
    # decisions[1] lacks its reason: a NOT NULL violation after decisions[0] was merged.
    bad = replace(plan.decisions[0], id="d-2", reason=None)  # type: ignore[arg-type]
    plan.decisions.append(bad)
    return {}


@pytest.mark.parametrize("break_it", [_dup_event, _dup_node, _null_decision], ids=["dup-event", "dup-node", "null"])
def test_a_failing_plan_leaves_nothing_behind(engine: Engine, db_url: str, break_it: Any) -> None:
    store = Store(engine)
    _seed(store)
    before = snapshot(db_url)

    plan = drain_plan("r01-n01", "d-1")
    extra = break_it(plan)
    kwargs: dict[str, Any] = {"events": [event("e-new")], "new_nodes": [(node_record("r01-n02"), "r01", T0)],
                              "nodes": [node_record("r01-n01", NodeState.DRAINING)], "received": T0}
    kwargs.update(extra)
    with pytest.raises(IntegrityError):
        store.commit(plan, **kwargs)

    assert snapshot(db_url) == before
    # ... and the store is still usable: the same plan without the bad part goes through.
    store.commit(drain_plan("r01-n01", "d-1"), nodes=[node_record("r01-n01", NodeState.DRAINING)])
    assert [d.id for d in store.decisions()] == ["d-1"]


def test_action_outcome_and_its_plan_are_one_transaction(engine: Engine, db_url: str) -> None:
    """update_action(..., plan=...) records the outcome only if the plan it caused is written too."""
    store = Store(engine)
    _seed(store)
    store.commit(drain_plan("r01-n01", "d-1"))
    before = snapshot(db_url)
    bad = drain_plan("r01-n01", "d-9")
    bad.decisions.append(replace(bad.decisions[0], id="d-10", reason=None))  # type: ignore[arg-type]
    with pytest.raises(IntegrityError):
        store.update_action("d-1:drain", status=ActionStatus.DONE, now=T0 + timedelta(seconds=1), result="drained",
                            plan=bad)
    assert snapshot(db_url) == before
    row = store.action("d-1:drain")
    assert row is not None
    assert row.status == ActionStatus.PENDING
