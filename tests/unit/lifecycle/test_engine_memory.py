"""What the engine remembers per node: sightings of the events an escalation counts, nothing else."""

from __future__ import annotations

import gc
from datetime import timedelta

from gpufleet.domain.events import EventKind
from gpufleet.lifecycle.policy import Policy

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
