"""The blast-radius breaker: a burst that flags every node drains at most the budget and trips."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.domain.errors import Conflict, NotFound
from gpufleet.domain.events import EventKind
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.breaker import Budget
from gpufleet.lifecycle.decisions import ComponentFault, DecisionStatus
from gpufleet.lifecycle.engine import LifecycleEngine, NodeRecord, OperatorOp, SchedObservation
from gpufleet.lifecycle.states import UNAVAILABLE, Actor, NodeState

from .helpers import T0, engine, ev, policy, xid


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
    assert len(out_nodes(eng)) == 2  # rack r01's share; the third r01 node tripped it, the rest were held
    now = T0 + timedelta(minutes=5)
    plan = eng.reset_breaker("alice", now, discard_held=False)
    assert any(a.action == "breaker_reset" and a.actor_id == "alice" for a in plan.audit)
    # Re-admitted one by one on the budget: other racks had room, up to the fleet's 4; the rest trip it again.
    out = out_nodes(eng)
    assert len(out) == 4 and all(sum(n.startswith(r) for n in out) <= 2 for r in ("r01", "r02", "r03", "r04"))
    assert eng.breaker.tripped and "budget" in eng.breaker.reason


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


def test_never_served_nodes_do_not_widen_the_budget() -> None:
    """40 serving nodes and 40 delivered spares (new, burn-in) in the same racks: the budget is a share of
    the 40 that serve (fleet 4, 2 per rack of 10), not of 80 (8, 5 per rack of 20)."""
    fleet = simulated_fleet(80, 4)
    serving = {n.id for i, n in enumerate(fleet) if i % 2 == 0}
    recs = [NodeRecord(n.id, NodeState.READY if n.id in serving else (NodeState.NEW if i % 4 == 1 else
                       NodeState.BURN_IN), T0 - timedelta(days=1), n.domains) for i, n in enumerate(fleet)]
    eng = LifecycleEngine(policy(), recs)
    by_rack = sorted(serving, key=lambda n: (sorted(x for x in serving if x[:3] == n[:3]).index(n), n))
    eng.observe([xid(n, 79, T0) for n in by_rack], T0)  # one per rack in turn
    out = out_nodes(eng)
    assert len(out) == 4
    per_rack: dict[str, int] = {}
    for n in out:
        per_rack[n.split("-")[0]] = per_rack.get(n.split("-")[0], 0) + 1
    assert max(per_rack.values()) <= 2
    assert eng.breaker.tripped and "of 40 nodes" in eng.breaker.reason


def test_a_reset_drains_held_nodes_whose_domains_have_room() -> None:
    eng = engine(40, 4, doc={"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 0.25}})
    r01 = sorted(n for n in eng.nodes if n.startswith("r01-"))
    r02 = sorted(n for n in eng.nodes if n.startswith("r02-"))
    eng.observe([xid(n, 79, T0) for n in r01[:3]], T0)  # rack r01 may lose 2 of 10: the third is held
    assert eng.breaker.tripped and set(eng.held) == {r01[2]}
    later = T0 + timedelta(minutes=1)
    eng.observe([xid(r02[0], 79, later)], later)  # r02 has room, but the breaker is tripped: held too
    assert set(eng.held) == {r01[2], r02[0]}
    eng.reset_breaker("alice", later + timedelta(minutes=1), discard_held=False)
    assert eng.nodes[r02[0]].state == NodeState.DRAINING  # its rack is within budget: drained at the reset
    assert set(eng.held) == {r01[2]} and eng.breaker.tripped  # r01 is still full: held, breaker tripped again
    assert eng.nodes[r01[2]].state == NodeState.SUSPECT


def test_a_reset_in_dry_run_keeps_the_held_decisions_for_when_it_is_off() -> None:
    """A reset in dry-run used to re-admit the held decisions as dry-run records and lose them: once
    dry-run was off, a node whose GPU fell off the bus stayed suspect (schedulable), nothing pending."""
    eng = engine(40, 4)
    eng.observe([xid(n, 79, T0) for n in sorted(eng.nodes)], T0)
    held = dict(eng.held)
    assert held and eng.breaker.tripped
    eng.set_dry_run(True, "erin", T0 + timedelta(minutes=1))
    with pytest.raises(Conflict, match=rf"re-admit {len(held)} held decision\(s\).*discard_held"):
        eng.reset_breaker("alice", T0 + timedelta(minutes=2), discard_held=False)
    assert eng.held == held and eng.breaker.tripped, "nothing changed"
    eng.set_dry_run(False, "erin", T0 + timedelta(minutes=3))
    plan = eng.reset_breaker("alice", T0 + timedelta(minutes=4), discard_held=False)
    readmitted = {t.node for t in plan.transitions if t.to_state is NodeState.DRAINING}
    assert readmitted and readmitted <= set(held), "re-admitted on the budget once dry-run is off"


def test_a_reset_in_dry_run_may_discard_the_held_decisions() -> None:
    eng = engine(40, 4)
    eng.observe([ev(n, EventKind.CHECK_FAILED, T0) for n in sorted(eng.nodes)], T0)
    held = dict(eng.held)
    eng.set_dry_run(True, "erin", T0)
    eng.reset_breaker("bob", T0 + timedelta(minutes=1), discard_held=True)
    assert not eng.held and not eng.breaker.tripped
    assert all(eng.nodes[n].state == NodeState.READY for n in held)


def _own_fault_then_a_group(eng: LifecycleEngine) -> tuple[str, str, ComponentFault]:
    """Node ``x`` held for its own XID 79 (the breaker tripped), then a held correlated group over it."""
    nodes = sorted(eng.nodes)
    eng.observe([xid(n, 79, T0) for n in nodes[:12]], T0)
    x = next(n for n in nodes if n in eng.held)
    own = eng.held[x].id
    fault = ComponentFault("leaf-su1-r1", "leaf_switch", (x, nodes[-1], nodes[-2]), "3 symptoms from 3 reporters")
    plan = eng.observe_component_fault(fault, T0 + timedelta(minutes=1))
    assert (own, DecisionStatus.SUPERSEDED) in plan.status_changes
    assert eng.held[x].actor_id == fault.group and eng.superseded[x].id == own
    return x, own, fault


def test_cancelling_a_held_group_for_a_node_holds_its_own_fault_again() -> None:
    """A drill: the leaf-switch group took the place of n3's held XID 79; the operator found the switch
    fine and cancelled the group's decision for n3, which went back to ready with a GPU off the bus."""
    eng = engine(40, 4)
    x, own, _ = _own_fault_then_a_group(eng)
    plan = eng.cancel_held(x, "carol", "leaf checked: switch is fine", T0 + timedelta(minutes=2))
    assert eng.held[x].id == own and (own, DecisionStatus.HELD) in plan.status_changes
    assert eng.nodes[x].state is NodeState.SUSPECT and not plan.transitions, "not back to ready"
    assert "held again" in plan.audit[0].detail
    eng.cancel_held(x, "carol", "the GPU was reseated", T0 + timedelta(minutes=3))  # now its own: a false alarm
    assert x not in eng.held and eng.nodes[x].state is NodeState.READY


def test_a_superseded_fault_outlives_a_restart_and_goes_with_an_approved_or_discarded_group() -> None:
    eng = engine(40, 4)
    x, own, fault = _own_fault_then_a_group(eng)
    records = list(eng.nodes.values())
    again = LifecycleEngine(eng.policy, records, breaker=eng.breaker, held=eng.held.values(),
                            superseded=eng.superseded.values())  # what the controller reloads
    again.cancel_held(x, "carol", "switch fine", T0 + timedelta(minutes=2))
    assert again.held[x].id == own
    approved = LifecycleEngine(eng.policy, records, breaker=eng.breaker, held=eng.held.values(),
                               superseded=eng.superseded.values())
    approved.approve_held(approved.held_group(fault.group), "dave", T0 + timedelta(minutes=2))
    assert x not in approved.held and not approved.superseded, "the group's drain carried the node out"
    discarded = LifecycleEngine(eng.policy, records, breaker=eng.breaker, held=eng.held.values(),
                                superseded=eng.superseded.values())
    plan = discarded.reset_breaker("bob", T0 + timedelta(minutes=2), discard_held=True)
    assert (own, DecisionStatus.CANCELLED) in plan.status_changes and not discarded.superseded


def test_nodes_out_in_the_scheduler_count_against_the_budget() -> None:
    """A drill: an operator drained two nodes in Slurm by hand; gpufleet, which still had them ready,
    then drained two more for fatal XIDs with the breaker "ok" — 4 of 5 nodes out."""
    eng = engine(20, 1)  # one rack: the fleet's 10 % is 2 nodes, the domain's 25 % is 5
    nodes = sorted(eng.nodes)
    by_hand = {n: SchedObservation(False, True, out_in_scheduler="drained: admin: PSU swap") for n in nodes[:2]}
    eng.sync(by_hand, T0)
    assert eng.external == set(nodes[:2]) and eng.nodes[nodes[0]].state is NodeState.READY
    plan = eng.observe([xid(nodes[5], 79, T0)], T0)
    assert [d.status for d in plan.decisions] == [DecisionStatus.HELD] and eng.breaker.tripped
    assert "fleet budget: 3 of 20" in eng.breaker.reason
    eng.sync({nodes[0]: SchedObservation(False, False)}, T0 + timedelta(minutes=1))  # back in service
    assert eng.external == {nodes[1]}
    eng.reset_breaker("alice", T0 + timedelta(minutes=2), discard_held=False)
    assert eng.nodes[nodes[5]].state is NodeState.DRAINING and not eng.breaker.tripped, "room again: re-admitted"


def test_a_node_gpufleet_already_took_out_is_not_counted_twice() -> None:
    eng = engine(20, 1)
    nodes = sorted(eng.nodes)
    eng.observe([xid(nodes[0], 79, T0)], T0)
    assert eng.nodes[nodes[0]].state is NodeState.DRAINING
    eng.sync({nodes[0]: SchedObservation(False, True, out_in_scheduler="drained: gpufleet:d-1")}, T0)
    assert not eng.external, "gpufleet's own: counted once, as its state"
    plan = eng.observe([xid(nodes[1], 79, T0 + timedelta(seconds=1))], T0 + timedelta(seconds=1))
    assert [d.status for d in plan.decisions] == [DecisionStatus.APPLIED]


def test_the_breaker_closes_when_the_last_held_decision_is_cancelled_within_the_budget() -> None:
    """The drill: every held decision dealt with, nothing held, and the breaker stayed tripped."""
    eng = engine(10, 1)  # fleet cap 1
    first, second = sorted(eng.nodes)[:2]
    eng.observe([xid(first, 79, T0)], T0)
    eng.observe([xid(second, 79, T0)], T0)
    assert eng.breaker.tripped and list(eng.held) == [second]
    plan = eng.cancel_held(second, "carol", "false alarm", T0 + timedelta(minutes=1))
    assert not eng.breaker.tripped and not eng.held
    assert plan.breaker is not None and not plan.breaker.tripped  # persisted with the cancellation
    (closed,) = [a for a in plan.audit if a.action == "breaker_closed"]
    assert closed.actor_id == "carol" and "fleet budget: 2 of 10" in closed.detail  # why it had tripped
    later = T0 + timedelta(minutes=2)  # automation acts again: a fault that fits is not held
    eng.operator(first, OperatorOp.RETIRE, "carol", "", later)
    assert [d.status for d in eng.observe([xid(sorted(eng.nodes)[2], 79, later)], later).decisions] == [
        DecisionStatus.APPLIED]


def test_approved_over_the_budget_the_breaker_stays_tripped_and_says_why() -> None:
    eng = engine(10, 1)
    first, second = sorted(eng.nodes)[:2]
    eng.observe([xid(first, 79, T0)], T0)
    eng.observe([xid(second, 79, T0)], T0)
    plan = eng.approve_held([second], "alice", T0 + timedelta(minutes=1))
    assert not eng.held and eng.breaker.tripped
    assert eng.breaker.reason.startswith("no decision held, but fleet budget: 2 of 10 nodes are unavailable (max 1")
    assert [a.action for a in plan.audit if a.actor_id == "alice"][-1] == "breaker_open"
    assert eng.breaker.since == T0  # still the trip's time


def test_an_operator_action_on_the_last_held_node_closes_the_breaker() -> None:
    eng = engine(10, 1)
    first, second = sorted(eng.nodes)[:2]
    eng.observe([xid(first, 79, T0)], T0)
    eng.observe([xid(second, 79, T0)], T0)
    eng.operator(first, OperatorOp.RETIRE, "dave", "", T0)  # the first is gone for good: one node of 9 out
    eng.operator(second, OperatorOp.RESUME, "dave", "checked by hand", T0 + timedelta(minutes=1))
    assert not eng.held and not eng.breaker.tripped


def test_the_budget_says_how_far_over_it_is() -> None:
    b = Budget(max_fleet=0.1, max_domain=0.5)
    members = {"rack:r01": frozenset({"a", "b", "c", "d"}), "rack:r02": frozenset({"e", "f", "g", "h"})}
    assert b.excess({"a", "b"}, members, 20) is None  # 2 of 20 fleet, 2 of 4 rack: at the caps
    assert b.excess({"a", "b", "c"}, members, 20) == "fleet budget: 3 of 20 nodes are unavailable (max 2 = 10%)"
    assert b.excess({"a", "b", "c"}, members, 40) == (
        "domain budget: 3 of 4 nodes in rack:r01 are unavailable (max 2 = 50%)")


def test_the_system_cancels_a_held_decision_in_its_own_name() -> None:
    eng = engine(10, 1)
    first, second = sorted(eng.nodes)[:2]
    eng.observe([ev(n, EventKind.HEARTBEAT_LOST, T0) for n in (first, second)], T0)
    (node,) = eng.held
    plan = eng.cancel_held(node, "controller", "the agent was heard again", T0, actor=Actor.SYSTEM)
    assert {a.actor for a in plan.audit if a.target == node} == {Actor.SYSTEM}
    assert [(t.actor, t.to_state) for t in plan.transitions] == [(Actor.SYSTEM, NodeState.READY)]
    # The trip is a stop for people: the system's own cancel leaves it tripped (a network blip that silenced
    # a fifth of the agents, then their return, is for someone to look at and reset).
    assert eng.breaker.tripped and not eng.held
    assert not [a for a in plan.audit if a.action in ("breaker_closed", "breaker_open")]
