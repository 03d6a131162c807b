"""A rebuilt window judged against the background the engine had learned (``Engine.prime``):
a controller restart replays its 30-minute window into a fresh engine; primed with the two hours of
stream before that window, the replay stands the verdicts the running engine stood, where a cold
replay (what the controller did before) named another part."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction
from gpufleet.correlate.scenarios import T0, Noise, TopologyKind
from gpufleet.correlate.weak import Split, WeakFault, generate_weak, weak_topology
from gpufleet.domain.eventio import FileEvent
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology

HGX: Topology = weak_topology(TopologyKind.HGX)
TWO_HOURS = timedelta(hours=2)


def _health(e: FileEvent, topo: Topology) -> HealthEvent:
    node = topo.node_of(e.component or "") or e.component or ""
    return HealthEvent(f"e{e.line}", node, e.kind, e.time, e.component, e.code, e.severity, e.link)


def _acting(engine: Engine) -> set[str]:
    return {s.component for s in engine.emitted() if s.action is not SuspectAction.OBSERVE}


def _three_ways(fault: WeakFault, seed: int, split: Split) -> tuple[str, set[str], set[str], set[str]]:
    """(truth, standing verdicts of) the engine that saw everything, a cold replay of the last 30
    minutes, and the same replay primed with the two hours before them."""
    sc = generate_weak(HGX, TopologyKind.HGX, fault, Noise.REALISTIC, seed, split, TWO_HOURS)
    events = [_health(e, HGX) for e in sc.events]
    live, cold, primed = Engine(HGX), Engine(HGX), Engine(HGX)
    for e in events:
        live.observe_health_event(e)
    assert primed.prime((e for e in events if e.time < T0), T0 - TWO_HOURS) == sum(e.time < T0 for e in events)
    for e in events:
        if e.time >= T0:
            cold.observe_health_event(e)
            primed.observe_health_event(e)
    return sc.truth, _acting(live), _acting(cold), _acting(primed)


def test_a_primed_replay_keeps_the_cable_verdict_the_running_engine_stood_where_a_cold_one_lost_it() -> None:
    # seed 5 until decision 0118 (a NIC end at its link-naming rate), under which its cold replay names the
    # cable too; 37 is a tune seed where the cold replay still loses it
    truth, live, cold, primed = _three_ways(WeakFault.IB_CABLE, 37, Split.TUNE)
    assert live == {truth}
    assert primed == live
    assert cold == set()  # what a restart did before: the marginal cable no longer named


@pytest.mark.parametrize(("fault", "seed", "split"), [
    # the running engine stood nothing; a cold replay blamed the cable (seed 7 until decision 0118)
    (WeakFault.IB_CABLE, 17, Split.TUNE),
    (WeakFault.LEAF, 7, Split.HELDOUT),  # likewise a leaf
])
def test_a_primed_replay_stands_what_the_running_engine_stood(fault: WeakFault, seed: int, split: Split) -> None:
    truth, live, cold, primed = _three_ways(fault, seed, split)
    assert primed == live == set()
    assert cold == {truth}


def test_priming_is_background_only() -> None:
    sc = generate_weak(HGX, TopologyKind.HGX, WeakFault.NVSWITCH, Noise.HEAVY, 0, Split.TUNE, TWO_HOURS)
    engine = Engine(HGX)
    engine.prime([_health(e, HGX) for e in sc.events], T0 - TWO_HOURS)  # the fault too: priming judges nothing
    assert engine.in_window == 0 and engine.suspects() == [] and engine.emitted() == []
    assert engine.background_window == TWO_HOURS
    assert Engine(HGX, coherence=False).background_window == timedelta(0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), cut=st.floats(0.0, 1.0))
def test_priming_any_prefix_leaves_no_symptom_and_no_verdict(seed: int, cut: float) -> None:
    sc = generate_weak(HGX, TopologyKind.HGX, WeakFault.NOISE_ONLY, Noise.REALISTIC, seed, Split.TUNE)
    engine = Engine(HGX)
    engine.prime([_health(e, HGX) for e in sc.events[: round(cut * len(sc.events))]], T0)
    assert engine.in_window == 0 and engine.suspects() == []


def test_priming_learns_what_the_running_engine_counted_flaps_in_their_hold_down_once() -> None:
    """Link flaps 7 s apart on one link: the running engine counts the first only (flap damping, 10 s
    hold-down), so priming must too, or the replay's background holds a reporter-minute the running
    engine never had."""
    link = next(lid for lid in HGX.links_of("r03-n02-nic1"))
    flaps = [HealthEvent(f"f{i}", "r03-n02", EventKind.LINK_FLAP, T0 - timedelta(minutes=10, seconds=-at),
                         "r03-n02-nic1", link=link) for i, at in enumerate((55, 62, 130))]
    live, primed = Engine(HGX), Engine(HGX)
    for e in flaps:
        live.observe_health_event(e)
    primed.prime(flaps, T0 - TWO_HOURS)
    assert live.coherence is not None and primed.coherence is not None
    learned = {k: dict(v.last) for k, v in live.coherence._seen.items()}
    assert learned == {k: dict(v.last) for k, v in primed.coherence._seen.items()}
    assert {k: dict(v.last) for k, v in live.coherence._seen_link.items()} == \
        {k: dict(v.last) for k, v in primed.coherence._seen_link.items()}
    assert sum(u for r in learned.values() for _, u, _ in r.values()) == 2  # :55 and 2:10 counted; :62 damped


def test_a_class_silent_for_the_rate_window_is_back_at_the_prior_in_the_running_engine_as_after_a_restart() -> None:
    """A leaf's corrected AER, then three hours of GPU reports only: the running engine must judge the
    leaves at the rate a restart primed with the last two hours has (the prior: it saw no leaf report),
    not at a rate of zero reports it kept from the leaf's old one."""
    leaf = sorted(c for c in HGX.components if HGX.components[c].kind.value == "leaf_switch")[0]
    gpus = sorted(c for c in HGX.components if HGX.components[c].kind.value == "gpu")
    events = [HealthEvent("leaf", HGX.node_of(leaf) or leaf, EventKind.AER_CORRECTED, T0 - timedelta(hours=3), leaf)]
    one_per_node = gpus[::8]  # one GPU of each node: no node gathers a pattern, all is background
    events += [HealthEvent(f"g{i}", HGX.node_of(g) or g, EventKind.ECC_SBE,
                           T0 - timedelta(hours=3) + timedelta(minutes=5 * i + 1), g)
               for i, g in enumerate(one_per_node[:40])]
    live, primed = Engine(HGX), Engine(HGX)
    for e in events:
        live.observe_health_event(e)
    primed.prime([e for e in events if e.time >= events[-1].time - TWO_HOURS], events[-1].time - TWO_HOURS)
    last = one_per_node[-1]
    now = HealthEvent("now", HGX.node_of(last) or last, EventKind.ECC_SBE, events[-1].time + timedelta(minutes=2), last)
    live.observe_health_event(now)
    primed.observe_health_event(now)
    assert live.coherence is not None and primed.coherence is not None
    assert not live.coherence._explained
    assert "leaf_switch" not in live.coherence._q and "leaf_switch" not in primed.coherence._q  # at the prior
    assert live.coherence.mu(leaf) == primed.coherence.mu(leaf)
    assert live.coherence._q["gpu"] == primed.coherence._q["gpu"]  # what both still see is learned alike
