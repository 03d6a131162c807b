"""The lifecycle engine's part in a maintenance rollout: taking a serving node out (with the checkpoint
request), the breaker's last word, the node held while its action runs, and auto-repair kept off it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.domain.errors import Conflict
from gpufleet.lifecycle.decisions import ActionKind
from gpufleet.lifecycle.engine import SchedObservation
from gpufleet.lifecycle.states import NodeState

from .helpers import T0, engine, xid


def test_a_serving_node_is_drained_after_its_job_checkpoints_and_counts_as_out() -> None:
    eng = engine(8, 2, doc={"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0}})
    node = sorted(eng.nodes)[0]
    eng.sync({node: SchedObservation(has_jobs=True, drained_empty=False)}, T0)
    plan = eng.maintenance_drain(node, "m-1", "operator:olga", T0)
    assert [a.action.kind for a in plan.actions] == [ActionKind.DRAIN_AFTER_CHECKPOINT]
    assert eng.nodes[node].state == NodeState.DRAINING and node in eng.unavailable()
    assert plan.decisions[0].actor_id == "operator:olga" and plan.decisions[0].rule == "maintenance"
    with pytest.raises(Conflict, match="not serving"):
        eng.maintenance_drain(node, "m-1", "operator:olga", T0)


def test_the_breaker_has_the_last_word() -> None:
    eng = engine(10, 1)  # the default budget: 1 node of 10
    first, second = sorted(eng.nodes)[:2]
    eng.maintenance_drain(first, "m-1", "op", T0)
    with pytest.raises(Conflict, match="fleet budget"):
        eng.maintenance_drain(second, "m-1", "op", T0)
    assert eng.budget_violation(second, eng.unavailable()) is not None
    assert eng.nodes[second].state == NodeState.READY and not eng.breaker.tripped, "a rollout never trips it"


def test_a_node_held_for_maintenance_is_not_handed_to_repair_and_its_action_needs_it_drained() -> None:
    eng = engine(4, 1, doc={"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
                            "policy": {"auto_repair": True}})
    held, other = sorted(eng.nodes)[:2]
    eng.maintenance_drain(held, "m-1", "op", T0)
    with pytest.raises(Conflict, match="not drained"):
        eng.maintenance_work(held, "maintenance m-1: reboot", "maintenance:m-1", T0)
    eng.observe([xid(other, 79, T0)], T0)  # fell off the bus: drained by the policy
    empty = SchedObservation(has_jobs=False, drained_empty=True)
    eng.sync({held: empty, other: empty}, T0 + timedelta(seconds=1))
    eng.tick(T0 + timedelta(hours=1), skip=frozenset({held}))
    assert eng.nodes[held].state == NodeState.DRAINED, "the rollout holds it"
    assert eng.nodes[other].state == NodeState.REPAIR, "auto-repair still works for the others"
    eng.maintenance_work(held, "maintenance m-1: reboot", "maintenance:m-1", T0 + timedelta(hours=1))
    assert eng.nodes[held].state == NodeState.REPAIR
    plan = eng.repair_succeeded(held, "maintenance reboot", "full", "maint:m-1:" + held, T0 + timedelta(hours=2))
    assert eng.nodes[held].state == NodeState.REVALIDATE
    assert [(a.action.kind, a.action.level) for a in plan.actions] == [(ActionKind.VALIDATE, "full")]
