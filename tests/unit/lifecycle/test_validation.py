"""Which validation a node gets (lifecycle.validation) and whom a fabric fault's node is paired with."""

from __future__ import annotations

from datetime import timedelta

from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.repair import RepairStep
from gpufleet.lifecycle.states import NodeState
from gpufleet.lifecycle.validation import Situation, is_fabric, level_after, plan_validation

from .helpers import T0, engine, ev, xid


def _rule(kind: EventKind, rule: str, check: str = "") -> HealthEvent:
    attrs = (("rule", rule),) + ((("check", check),) if check else ())
    return HealthEvent("x", "n", kind, T0, "n-port", attrs=attrs)


def test_the_level_follows_what_was_done() -> None:
    assert level_after(RepairStep.GPU_RESET) == "quick"
    assert level_after(RepairStep.RESTART_FABRIC_MANAGER) == "quick"
    assert level_after(RepairStep.REBOOT) == "full"
    assert level_after(Situation.PEOPLE) == "full"
    assert level_after(Situation.BURN_IN) == "burnin"


def test_operator_and_burn_in_plans_take_their_level_from_the_one_table() -> None:
    eng = engine(4, 1)
    node = sorted(eng.nodes)[0]
    eng.operator(node, OperatorOp.DRAIN, "op", "", T0)
    eng.nodes[node].state = NodeState.REPAIR
    plan = eng.operator(node, OperatorOp.REPAIR_DONE, "op", "", T0 + timedelta(minutes=1))
    assert [(a.action.kind, a.action.level) for a in plan.actions] == [("validate", "full")]
    fresh = engine(2, 1, state=NodeState.NEW)
    n = sorted(fresh.nodes)[0]
    plan = fresh.operator(n, OperatorOp.BURN_IN, "op", "", T0)
    assert ("validate", "burnin") in [(a.action.kind, a.action.level) for a in plan.actions]


def test_fabric_faults_are_links_nvswitches_and_failed_multinode_checks_not_pcie() -> None:
    assert is_fabric([_rule(EventKind.LINK_DOWN, "ib_down")])
    assert is_fabric([_rule(EventKind.LINK_ERROR, "nvlink_errors")])
    assert is_fabric([_rule(EventKind.LINK_FLAP, "ib_flap")])
    assert is_fabric([HealthEvent("s", "n", EventKind.SXID, T0, "n-nvsw0", 12028)])
    assert is_fabric([_rule(EventKind.CHECK_FAILED, "multinode_pair", check="multinode_pair")])
    assert not is_fabric([_rule(EventKind.LINK_ERROR, "pcie_width")])  # the GPU's slot
    assert not is_fabric([xid("n", 79, T0), ev("n", EventKind.ECC_DBE, T0)])
    assert not is_fabric([_rule(EventKind.CHECK_FAILED, "gemm_bf16", check="gemm_bf16")])
    assert not is_fabric([])


def test_a_fabric_fault_is_validated_by_pairing_but_a_burn_in_keeps_its_soak() -> None:
    assert plan_validation("quick", fabric=True, partners=1) == plan_validation("full", fabric=True, partners=1)
    assert plan_validation("full", fabric=True, partners=2).level == "multinode"
    assert plan_validation("full", fabric=True, partners=2).partners == 2
    assert plan_validation("full", fabric=False, partners=2).partners == 0
    assert plan_validation("quick", fabric=True, partners=0).level == "quick"  # pairing off
    assert plan_validation("burnin", fabric=True, partners=1).level == "burnin"


def test_partners_are_ready_idle_nodes_within_the_budget_nearest_first() -> None:
    eng = engine(8, 2)  # racks of 4: fleet cap 1 (10 % of 8, at least 1), domain cap 1
    nodes = sorted(eng.nodes)
    fixed = nodes[0]
    eng.operator(fixed, OperatorOp.DRAIN, "op", "", T0)  # out of service, as on its way to repair
    idle = set(nodes)
    # default budget: 1 of 8 may be out, and the node under validation already is
    assert eng.pairing_partners(fixed, 1, idle) == ()
    roomy = engine(8, 2, doc={"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0}})
    roomy.operator(fixed, OperatorOp.DRAIN, "op", "", T0)
    mates = sorted(n for n in nodes if n != fixed and roomy.nodes[n].domains & roomy.nodes[fixed].domains)
    got = roomy.pairing_partners(fixed, 1, idle)
    assert got == (mates[0],), (got, mates)  # same failure domain first
    busy = {mates[0]}
    roomy.nodes[mates[0]].state = NodeState.IN_SERVICE  # running a job: never taken
    assert mates[0] not in roomy.pairing_partners(fixed, 3, idle)
    assert mates[1] not in roomy.pairing_partners(fixed, 1, idle - {mates[1]})  # not idle in the scheduler
    assert len(roomy.pairing_partners(fixed, 2, idle - busy)) == 2
    assert roomy.pairing_partners(fixed, 99, idle) == ()  # not enough: none rather than too few


def test_no_partners_while_the_breaker_is_tripped() -> None:
    eng = engine(40, 4)
    eng.observe([xid(n, 79, T0) for n in sorted(eng.nodes)], T0)
    assert eng.breaker.tripped
    out = sorted(eng.unavailable())
    assert eng.pairing_partners(out[0], 1, set(eng.nodes)) == ()
