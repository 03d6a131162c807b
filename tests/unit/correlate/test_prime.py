"""A rebuilt window judged against the background the engine had learned (``Engine.prime_health_event``):
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
from gpufleet.domain.events import HealthEvent
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
        if e.time >= T0:
            cold.observe_health_event(e)
            primed.observe_health_event(e)
        else:
            primed.prime_health_event(e)
    return sc.truth, _acting(live), _acting(cold), _acting(primed)


def test_a_primed_replay_names_the_chip_the_running_engine_named_where_a_cold_one_named_its_node() -> None:
    truth, live, cold, primed = _three_ways(WeakFault.NVSWITCH, 5, Split.TUNE)
    assert live == {truth}
    assert primed == live
    assert cold != live and truth not in cold  # what a restart did before: another part named


@pytest.mark.parametrize(("fault", "seed", "split"), [
    (WeakFault.IB_CABLE, 5, Split.TUNE),  # the running engine named the cable; a cold replay did not
    (WeakFault.LEAF, 7, Split.HELDOUT),  # the running engine named nothing; a cold replay blamed the leaf
])
def test_a_primed_replay_stands_what_the_running_engine_stood(fault: WeakFault, seed: int, split: Split) -> None:
    _, live, cold, primed = _three_ways(fault, seed, split)
    assert primed == live
    assert cold != live


def test_priming_is_background_only() -> None:
    sc = generate_weak(HGX, TopologyKind.HGX, WeakFault.NVSWITCH, Noise.HEAVY, 0, Split.TUNE, TWO_HOURS)
    engine = Engine(HGX)
    for e in sc.events:
        engine.prime_health_event(_health(e, HGX))  # the fault too: priming judges nothing
    assert engine.in_window == 0 and engine.suspects() == [] and engine.emitted() == []
    assert engine.background_window == TWO_HOURS
    assert Engine(HGX, coherence=False).background_window == timedelta(0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), cut=st.floats(0.0, 1.0))
def test_priming_any_prefix_leaves_no_symptom_and_no_verdict(seed: int, cut: float) -> None:
    sc = generate_weak(HGX, TopologyKind.HGX, WeakFault.NOISE_ONLY, Noise.REALISTIC, seed, Split.TUNE)
    engine = Engine(HGX)
    for e in sc.events[: round(cut * len(sc.events))]:
        engine.prime_health_event(_health(e, HGX))
    assert engine.in_window == 0 and engine.suspects() == []
