"""What the engine remembers per node: sightings of the events an escalation counts, nothing else."""

from __future__ import annotations

import gc
from datetime import timedelta

from gpufleet.domain.events import EventKind
from gpufleet.lifecycle.policy import Policy
from gpufleet.lifecycle.states import NodeState

from .helpers import T0, engine, ev, policy, xid


def test_only_events_an_escalation_counts_are_remembered() -> None:
    p: Policy = policy()
    counted = {(e.kind, e.code) for e in p.catalog.escalations}
    assert ("ecc_sbe", None) in counted and ("xid", 94) in counted  # the defaults this test leans on
    eng = engine(4, 1)
    node = next(iter(eng.nodes))
    now = T0 + timedelta(minutes=1)
    eng.observe([xid(node, 13, now), ev(node, EventKind.AER_CORRECTED, now),
                 ev(node, EventKind.ECC_SBE, now), xid(node, 94, now)], now)
    assert sorted((kind, code) for _t, kind, code in eng.nodes[node].recent) == [("ecc_sbe", None), ("xid", 94)]


def test_an_escalation_still_counts_across_calls_and_remembered_sightings_cost_the_collector_nothing() -> None:
    eng = engine(4, 1)
    node = next(iter(eng.nodes))
    limit = next(e for e in eng.policy.catalog.escalations if e.kind == "ecc_sbe").count
    for i in range(limit - 1):
        at = T0 + timedelta(seconds=i)
        assert not eng.observe([ev(node, EventKind.ECC_SBE, at), xid(node, 13, at)], at).decisions
    gc.collect(0)
    assert not any(gc.is_tracked(s) for s in eng.nodes[node].recent)
    at = T0 + timedelta(seconds=limit)
    plan = eng.observe([ev(node, EventKind.ECC_SBE, at)], at)
    (decision,) = plan.decisions
    assert f"seen {limit} times" in decision.reason


def test_a_storm_of_one_counted_kind_does_not_push_out_what_another_escalation_counts() -> None:
    # XID 94 twice within a day escalates; between the two, a day-long trickle of corrected ECC errors
    # (below their own hourly threshold) is far more than any fixed per-node bound could hold.
    eng = engine(4, 1)
    node = next(iter(eng.nodes))
    sbe = next(e for e in eng.policy.catalog.escalations if e.kind == "ecc_sbe")
    x94 = next(e for e in eng.policy.catalog.escalations if e.kind == "xid" and e.code == 94)
    eng.nodes[node].has_jobs = True  # the first XID 94 makes it suspect (drain at the next checkpoint)
    (first,) = eng.observe([xid(node, 94, T0)], T0).decisions
    assert first.to_state == NodeState.SUSPECT
    per_hour = sbe.count // 2
    hours = int(x94.window / timedelta(hours=1)) - 2
    for h in range(hours):
        for i in range(per_hour):
            at = T0 + timedelta(hours=h, seconds=1 + i * 3600 // per_hour)
            assert not eng.observe([ev(node, EventKind.ECC_SBE, at)], at).decisions
    at = T0 + timedelta(hours=hours)
    (decision,) = eng.observe([xid(node, 94, at)], at).decisions
    assert f"seen {x94.count} times" in decision.reason and decision.to_state == NodeState.DRAINING
    # What is kept is bounded by what the escalations can count, not by the storm's length.
    kept = eng.nodes[node].recent
    assert len(kept) <= sum(e.count for e in eng.policy.catalog.escalations)


def test_weak_link_reports_are_witnesses_only_and_never_escalate_a_node() -> None:
    """A drill of the review: five links of one GPU each sending a weak report a minute (rule
    nvlink_error_seen, judged info) for twelve minutes are 60 link_error events in ten minutes, past the
    default escalation (50 link errors in 10 min: degraded, drain). They are no decision; as many
    informational link errors without a weak-report rule (a link_error judged by its kind) are one."""
    from gpufleet.domain.events import WEAK_REPORT_RULES, HealthEvent

    esc = next(e for e in policy().catalog.escalations if e.kind == "link_error")
    for rule, decides in (*((r, False) for r in sorted(WEAK_REPORT_RULES)), ("", True)):
        eng = engine(4, 1)
        node = next(iter(eng.nodes))
        decisions = []
        for m in range(12):
            at = T0 + timedelta(minutes=m)
            batch = [HealthEvent(f"{rule}-{m}-{k}", node, EventKind.LINK_ERROR, at, f"{node}-gpu0",
                                 link=f"{node}-gpu0~nvlink{k}", attrs=(("rule", rule),) if rule else ())
                     for k in range(5)]
            decisions += eng.observe(batch, at).decisions
        assert esc.count < 5 * 12
        assert bool(decisions) is decides, (rule, decisions)
        assert not decides or "times within" in decisions[0].reason, decisions[0].reason
