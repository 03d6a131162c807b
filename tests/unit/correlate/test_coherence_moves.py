"""Moves amplify weak evidence (issue #14 item 3): a weak pattern seen at a unit's old slot and again
at its new slot names the unit; seen again at the old slot under another unit, it names the slot."""

from __future__ import annotations

import math
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.correlate.candidates import Cand
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Basis, SuspectAction, VerdictStatus
from gpufleet.correlate.scenarios import Noise, TopologyKind
from gpufleet.correlate.weak import Split, WeakFault, generate_weak, weak_topology
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology_gen import generate_hgx
from tests.unit.correlate.helpers import Stream

TOPO = generate_hgx(16)
NICS = TOPO.of_kind(K.NIC)
A, B = "r01-n02-nic3", "r03-n01-nic5"


def _nic_pattern(s: Stream, nic: str, at: float) -> None:
    """A failing NIC's SerDes: three symbol errors on its port and two corrected AERs in six minutes."""
    port = TOPO.links_of(nic)[0]
    for i in range(3):
        s.add(at + 100 * i, E.LINK_ERROR, nic, link=port)
    for i in range(2):
        s.add(at + 50 + 150 * i, E.AER_CORRECTED, nic)


def _swap(s: Stream, at: float, a: str = A, b: str = B) -> None:
    s.add(at, E.MOVED, serial=TOPO.components[a].serial, src=a, dst=b)
    s.add(at + 30, E.MOVED, serial=TOPO.components[b].serial, src=b, dst=a)


def _actionable(eng: Engine, s: Stream) -> list[str]:
    return [v.suspect.component for ev in s.events for v in eng.observe(ev)
            if v.status is not VerdictStatus.CLEARED and v.suspect.action is not SuspectAction.OBSERVE]


def test_the_weak_pattern_alone_is_not_enough() -> None:
    s = Stream()
    _nic_pattern(s, A, 60)
    eng = Engine(TOPO)
    assert _actionable(eng, s) == []
    assert eng.coherence is not None and not eng.coherence.is_significant(A)


def test_a_weak_pattern_that_follows_the_unit_names_its_new_slot() -> None:
    s = Stream()
    _nic_pattern(s, A, 60)
    _swap(s, 480)
    _nic_pattern(s, B, 600)
    eng = Engine(TOPO)
    assert _actionable(eng, s) == [B]
    top = eng.suspects()[0]
    assert top.component == B and top.finding is Basis.FOLLOWS_SERIAL
    assert top.serial == TOPO.components[A].serial  # the unit that carried the pattern


def test_a_weak_pattern_that_stays_names_the_old_slot() -> None:
    s = Stream()
    _nic_pattern(s, A, 60)
    _swap(s, 480)
    _nic_pattern(s, A, 600)  # again at A, now holding B's unit: the slot (its cable, its port)
    eng = Engine(TOPO)
    named = _actionable(eng, s)
    assert named and set(named) <= {A, TOPO.links_of(A)[0]}
    top = eng.suspects()[0]
    assert top.finding is Basis.STAYS_AT_SLOT


def test_the_unit_swapped_in_does_not_inherit_the_pattern_of_the_unit_it_replaced() -> None:
    """The pattern at A before the swap and again at A after it is the slot's (check the cabling), even
    when B's unit had a weak event or two at B before it was swapped into A. Keeping, at the swap's
    second half, B's live pattern combined with the evidence A's unit had just brought to B handed that
    evidence to B's unit: the engine named it (healthy) ``follows_serial``, drain and replace."""
    for weak_at_b in (1, 2):
        s = Stream()
        _nic_pattern(s, A, 60)
        for i in range(weak_at_b):
            s.add(100 + 50 * i, E.AER_CORRECTED, B)
        _swap(s, 900)
        _nic_pattern(s, A, 1000)
        eng = Engine(TOPO)
        named = _actionable(eng, s)
        assert named and set(named) <= {A, TOPO.links_of(A)[0]}, weak_at_b
        top = eng.suspects()[0]
        assert top.finding is Basis.STAYS_AT_SLOT and top.action is SuspectAction.CHECK_CABLING, (weak_at_b, top)


def test_the_same_pattern_at_an_unrelated_nic_is_not_combined() -> None:
    s = Stream()
    _nic_pattern(s, A, 60)
    _swap(s, 480)
    _nic_pattern(s, "r04-n03-nic1", 600)  # neither the unit's new slot nor its old one
    assert _actionable(Engine(TOPO), s) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(0, 1700), st.sampled_from(NICS), st.sampled_from(["link", "aer"])),
                max_size=30),
       st.floats(100, 1500), st.sampled_from(NICS), st.sampled_from(NICS))
def test_swapping_healthy_units_under_sparse_noise_creates_no_verdict(
    noise: list[tuple[float, str, str]], at: float, a: str, b: str
) -> None:
    """Background: at most one event per NIC; a swap of two units must not turn it into a verdict."""
    s = Stream()
    seen: set[str] = set()
    events = []
    for t, nic, what in sorted(noise):
        if nic in seen:
            continue
        seen.add(nic)
        events.append((t, nic, what))
    moved = False
    for t, nic, what in events:
        if not moved and t >= at and a != b:
            _swap(s, at, a, b)
            moved = True
        if what == "link":
            s.add(t, E.LINK_ERROR, nic, link=TOPO.links_of(nic)[0])
        else:
            s.add(t, E.AER_CORRECTED, nic)
    assert _actionable(Engine(TOPO), s) == []


def test_a_slot_with_a_kept_pattern_and_nothing_live_is_scored_without_error() -> None:
    """Found by the weak suite with a warm-up (NVL72, heavy noise, cable_stays, tune seed 11): a second
    move out of a slot whose candidate kept a barely-surprising pattern from the first move, and has no
    witness left in the window. Its live ln p is ln 3 (SCAN times a tail of 1), so Fisher's combination
    got x = ln 3 + ln p_kept > 1 and math.log1p(-x) raised ValueError inside Engine.observe."""
    eng = Engine(TOPO)
    coh = eng.coherence
    assert coh is not None
    port = TOPO.links_of(A)[0]
    t = 10_000.0
    coh._hist[port] = {"stays": (t - 600.0, -0.05)}  # kept by a move 10 minutes ago: p = 0.95
    st = Cand({}, {}, coh._cls(port), 0, math.inf)  # every witness aged out of the window
    assert coh._score(port, st, t, 0.0) is False
    assert math.isfinite(st.log_p) and st.log_p > 0.0  # the live pattern alone, as the screen left it


def test_the_warm_weak_scenario_that_raised_runs_through() -> None:
    topo = weak_topology(TopologyKind.NVL72)
    sc = generate_weak(topo, TopologyKind.NVL72, WeakFault.CABLE_STAYS, Noise.HEAVY, 11, Split.TUNE,
                       timedelta(minutes=30))
    eng = Engine(topo)
    moves = sum(1 for ev in sc.events if ev.kind is E.MOVED)
    assert moves >= 2
    verdicts = [v for ev in sc.events for v in eng.observe(ev)]  # raised ValueError on the second move
    assert all(0.0 <= v.suspect.confidence <= 1.0 for v in verdicts)



NVL = weak_topology(TopologyKind.NVL72)
_TRAYS = [c for c in NVL.of_kind(K.COMPUTE_TRAY) if c.startswith("r01-")][:4]
_STEP = st.tuples(st.floats(0, 1200), st.sampled_from(["gpu", "nic", "swap"]), st.integers(0, 3),
                  st.integers(0, 3), st.integers(0, 3))


def _inside(tray: str, kind: K, k: int) -> str:
    parts = sorted(c for c in NVL.descendants(tray) if NVL.components[c].kind is kind)
    return parts[k % len(parts)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEP, min_size=1, max_size=40))
def test_weak_events_and_repeated_tray_swaps_never_break_the_engine(
    steps: list[tuple[float, str, int, int, int]]
) -> None:
    """NVL72 compute trays swapped back and forth between four slots over hours, weak GPU and NIC events
    between: every event is taken and every verdict's confidence is a probability. (A fuzz of the move
    path; it did not find the Fisher crash above in 200 examples: that needs a kept p within 10 % of 1.)"""
    s = Stream()
    unit = {slot: NVL.components[slot].serial for slot in _TRAYS}  # which serial sits in which slot now
    t = 0.0
    for gap, what, i, j, k in steps:
        t += gap
        a, b = _TRAYS[i], _TRAYS[j]
        if what == "swap":
            if a == b:
                continue
            s.add(t, E.MOVED, serial=unit[a], src=a, dst=b)
            s.add(t + 30, E.MOVED, serial=unit[b], src=b, dst=a)
            unit[a], unit[b] = unit[b], unit[a]
        elif what == "gpu":
            gpu = _inside(a, K.GPU, k)
            links = [lid for lid in NVL.links_of(gpu) if NVL.links[lid].kind == "nvlink"]
            s.add(t, E.LINK_ERROR, gpu, link=links[(j + k) % len(links)])
        else:
            s.add(t, E.AER_CORRECTED, _inside(a, K.NIC, k))
    eng = Engine(NVL)
    for ev in s.events:
        for v in eng.observe(ev):
            assert 0.0 <= v.suspect.confidence <= 1.0
    assert all(0.0 <= x.confidence <= 1.0 for x in eng.suspects())
