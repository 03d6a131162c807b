"""The blast-radius breaker: a burst that flags every node drains at most the budget and trips."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.domain.errors import NotFound
from gpufleet.domain.events import EventKind
from gpufleet.lifecycle.breaker import Budget
from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.states import UNAVAILABLE, NodeState

from .helpers import T0, engine, ev, xid


def out_nodes(eng: object) -> set[str]:
    return eng.unavailable()  # type: ignore[attr-defined,no-any-return]


def test_flagging_every_node_drains_at_most_the_budget_and_trips() -> None:
    eng = engine(40, 4)  # 40 nodes: fleet cap 4 (10 %), rack cap 2 of 10 (25 %)
    plan = eng.observe([xid(n, 79, T0) for n in sorted(eng.nodes)], T0)
    applied = [d for d in plan.decisions if d.status == DecisionStatus.APPLIED]
    held = [d for d in plan.decisions if d.status == DecisionStatus.HELD]
    assert len(applied) <= 4 and len(out_nodes(eng)) <= 4
    assert len(applied) + len(held) == 40
    assert eng.breaker.tripped and "budget" in eng.breaker.reason
    assert plan.breaker is not None and plan.breaker.tripped
    assert any(a.action == "breaker_trip" for a in plan.audit)
    per_rack: dict[str, int] = {}
    for n in out_nodes(eng):
        per_rack[n.split("-")[0]] = per_rack.get(n.split("-")[0], 0) + 1
    assert max(per_rack.values()) <= 2
    # Held nodes are marked suspect (still usable) and have no actions queued.
    assert {eng.nodes[d.node].state for d in held} == {NodeState.SUSPECT}
    assert {a.action.node for a in plan.actions} <= {d.node for d in applied}


def test_once_tripped_even_budget_room_is_held_until_reset() -> None:
    eng = engine(40, 4)
    eng.observe([xid(n, 79, T0) for n in sorted(eng.nodes)[:12]], T0)
    assert eng.breaker.tripped
    later = T0 + timedelta(minutes=1)
    plan = eng.observe([xid(sorted(eng.nodes)[-1], 79, later)], later)
    assert [d.status for d in plan.decisions] == [DecisionStatus.HELD]


def test_reset_readmits_within_budget_and_trips_again_if_needed() -> None:
    eng = engine(40, 4)
    eng.observe([xid(n, 79, T0) for n in sorted(eng.nodes)], T0)
    before = len(out_nodes(eng))
    now = T0 + timedelta(minutes=5)
    plan = eng.reset_breaker("alice", now, discard_held=False)
    assert any(a.action == "breaker_reset" and a.actor_id == "alice" for a in plan.audit)
    # The budget was already full, so the re-admitted decisions trip it again, nothing more goes out.
    assert len(out_nodes(eng)) == before
    assert eng.breaker.tripped


def test_reset_with_discard_cancels_held_and_returns_nodes() -> None:
    eng = engine(40, 4)
    eng.observe([ev(n, EventKind.CHECK_FAILED, T0) for n in sorted(eng.nodes)], T0)
    held = dict(eng.held)
    assert held
    plan = eng.reset_breaker("bob", T0 + timedelta(minutes=1), discard_held=True)
    assert not eng.breaker.tripped and not eng.held
    assert {did for did, st in plan.status_changes if st == DecisionStatus.CANCELLED} >= {d.id for d in held.values()}
    assert all(eng.nodes[n].state == NodeState.READY for n in held)


def test_cancel_one_held_decision() -> None:
    eng = engine(40, 4)
    eng.observe([ev(n, EventKind.CHECK_FAILED, T0) for n in sorted(eng.nodes)], T0)
    node = next(iter(eng.held))
    plan = eng.cancel_held(node, "carol", "false alarm", T0 + timedelta(minutes=1))
    assert node not in eng.held and eng.nodes[node].state == NodeState.READY
    assert plan.audit[0].actor_id == "carol"
    with pytest.raises(NotFound):
        eng.cancel_held(node, "carol", "again", T0 + timedelta(minutes=2))


def test_operator_drain_is_not_subject_to_the_breaker() -> None:
    eng = engine(40, 4)
    eng.observe([xid(n, 79, T0) for n in sorted(eng.nodes)], T0)
    victim = next(n for n, r in eng.nodes.items() if r.state == NodeState.SUSPECT)
    plan = eng.operator(victim, OperatorOp.DRAIN, "dave", "manual", T0 + timedelta(minutes=1))
    assert eng.nodes[victim].state == NodeState.DRAINING
    assert plan.transitions[0].actor_id == "dave"


def test_dry_run_records_and_acts_on_nothing() -> None:
    eng = engine(10, 2)
    eng.set_dry_run(True, "erin", T0)
    plan = eng.observe([xid(n, 79, T0) for n in sorted(eng.nodes)], T0)
    assert plan.decisions and all(d.status == DecisionStatus.DRY_RUN for d in plan.decisions)
    assert plan.actions == [] and plan.transitions == []
    assert not any(r.state in UNAVAILABLE for r in eng.nodes.values())


@pytest.mark.parametrize(("size", "share", "cap"), [(32, 0.10, 3), (8, 0.25, 2), (3, 0.10, 1), (100, 0.10, 10)])
def test_budget_caps(size: int, share: float, cap: int) -> None:
    assert Budget().allowed(size, share) == cap


def test_new_nodes_burn_in_without_consuming_the_budget() -> None:
    eng = engine(20, 2, NodeState.NEW)
    plan = eng.tick(T0)
    assert sum(1 for t in plan.transitions if t.to_state == NodeState.BURN_IN) == 20
    assert not eng.breaker.tripped
