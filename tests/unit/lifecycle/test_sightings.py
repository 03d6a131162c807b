"""policy.Sightings against the plain definition: an escalation counts every event it matches, at its
time or (stamped later than it arrived) at its arrival, inside its window ending now."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.catalog import Action, Escalation
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.lifecycle.policy import Policy, Sightings
from gpufleet.lifecycle.states import NodeState

from .helpers import T0, engine, ev, policy, xid

# Two escalations over one kind (one by code, one for any code) and one over another kind.
ESCALATIONS = (
    Escalation("xid", 94, 2, timedelta(hours=24), Severity.FATAL, Action.RESET_GPU),
    Escalation("xid", None, 3, timedelta(hours=1), Severity.DEGRADED, Action.DRAIN_AND_INSPECT),
    Escalation("ecc_sbe", None, 4, timedelta(minutes=10), Severity.DEGRADED, Action.DRAIN_AND_INSPECT),
)
KINDS = [(EventKind.XID, 94), (EventKind.XID, 13), (EventKind.ECC_SBE, None), (EventKind.AER_CORRECTED, None)]


def _policy() -> Policy:
    p = policy()
    return Policy(p.config, replace(p.catalog, escalations=ESCALATIONS))


arrivals = st.lists(
    st.tuples(st.integers(0, 600),  # seconds since the previous arrival (the controller's clock moves on)
              st.integers(-3 * 3600, 2 * 3600),  # the event's stamp relative to its arrival (late or ahead)
              st.sampled_from(range(len(KINDS)))),
    min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(arrivals)
def test_each_escalation_counts_what_the_plain_definition_counts_up_to_its_count(
        steps: list[tuple[int, int, int]]) -> None:
    p = _policy()
    kept = Sightings()
    seen: list[tuple[object, ...]] = []  # (counted time, kind, code) of every event so far
    now = T0
    for n, (gap, offset, k) in enumerate(steps):
        now += timedelta(seconds=gap)
        kind, code = KINDS[k]
        e = HealthEvent(f"e{n}", "n1", kind, now + timedelta(seconds=offset), "n1-gpu0", code)
        p.remember(kept, e, now)
        p.prune(kept, now)
        seen.append((min(e.time, now), kind.value, code))
        for i, esc in enumerate(ESCALATIONS):
            since = now - esc.window
            plain = sum(1 for t, kd, c in seen if kd == esc.kind and (esc.code is None or c == esc.code)
                        and since <= t <= now)  # type: ignore[operator]
            held = sum(1 for t, _kd, _c in kept.kept.get(i, ()) if since <= t <= now)
            assert held == min(plain, esc.count), (i, plain, held)
            assert len(kept.kept.get(i, ())) <= esc.count


def test_an_event_stamped_ahead_does_not_push_out_what_the_window_still_counts() -> None:
    # An agent clock ahead that no heartbeat has measured yet: its XID 94 counts at its arrival, so the
    # two XID 94s after it make "twice in 24 h" (before, the one stamped ahead took a place and counted
    # for nothing until the controller's clock passed it).
    eng = engine(4, 1)
    node = next(iter(eng.nodes))
    eng.nodes[node].has_jobs = True
    (first,) = eng.observe([xid(node, 94, T0 + timedelta(minutes=10))], T0).decisions
    assert first.to_state == NodeState.SUSPECT
    at = T0 + timedelta(minutes=1)
    (second,) = eng.observe([xid(node, 94, at)], at).decisions
    assert second.to_state == NodeState.DRAINING and "seen 2 times" in second.reason


def test_a_nodes_history_costs_the_cycle_collector_nothing() -> None:
    import gc

    eng = engine(4, 1)
    node = next(iter(eng.nodes))
    for i in range(30):
        at = T0 + timedelta(seconds=i)
        eng.observe([ev(node, EventKind.ECC_SBE, at), xid(node, 94, at)], at)
    gc.collect()
    gc.collect()  # the inner tuples first, then the tuples and the dict that hold them
    rec = eng.nodes[node].recent
    assert rec.kept and not gc.is_tracked(rec.kept)
    assert not any(gc.is_tracked(v) for v in rec.kept.values())
