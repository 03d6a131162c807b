"""The watch list (``Engine.watching``): weak patterns close to significance but not there. Nothing acts
on them; asking for the list must not change a verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import WATCH_DECADES
from gpufleet.correlate.scenarios import Noise, TopologyKind
from gpufleet.correlate.weak import WEAK_FAULTS, Split, generate_weak, weak_topology
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_nvl72

T0 = datetime(2026, 11, 28, 12, tzinfo=UTC)


@pytest.fixture(scope="module")
def rack() -> Topology:
    return generate_nvl72(1)


def one_error(topo: Topology, tray: str, gpu: int, n: int) -> HealthEvent:
    """``tray``'s GPU ``gpu`` logs one corrected error on its NVLink 5 (to one chip for every GPU)."""
    g = f"{tray}-gpu{gpu}"
    link = [lid for lid in topo.links_of(g) if topo.links[lid].kind == "nvlink"][5]
    return HealthEvent(f"e{n}", tray, EventKind.LINK_ERROR, T0 + timedelta(seconds=10 * n), g, link=link)


def test_a_pattern_short_of_significance_is_watched_until_it_becomes_a_verdict(rack: Topology) -> None:
    trays = sorted(c for c in rack.components if rack.components[c].kind.value == "compute_tray")
    events = [one_error(rack, t, i % 4, i) for i, t in enumerate(trays[:4])]
    chip = rack.links[events[0].link or ""].other(events[0].component)
    eng = Engine(rack, coherence=True)
    for e in events[:2]:
        assert eng.observe_health_event(e) == []
    far = {w.component: w for w in eng.watching(events[1].time, decades=6.0)}
    assert chip in far and far[chip].decades > WATCH_DECADES  # two reports: still far from it
    assert chip not in {w.component for w in eng.watching(events[1].time)}
    assert eng.observe_health_event(events[2]) == []
    (w,) = [w for w in eng.watching(events[2].time) if w.component == chip]
    assert (w.kind, w.witnesses, w.last) == ("nvswitch", 3, events[2].time)
    assert w.reporters == tuple(sorted(e.component for e in events[:3]))
    assert 0 < w.decades < far[chip].decades  # a third witness brought it closer
    assert [v.suspect.component for v in eng.observe_health_event(events[3])] == [chip]
    assert chip not in {x.component for x in eng.watching(events[3].time, decades=6.0)}  # a verdict now


def test_a_part_with_a_verdict_from_its_counts_is_not_also_watched() -> None:
    """Three ports down towards one leaf: a verdict from the fatal events' counts, while the leaf's
    coherence pattern (three witnesses) is short of significance. The leaf is acted on; it is not watched."""
    from gpufleet.domain.topology_gen import generate_hgx

    topo = generate_hgx(8)
    nodes = sorted(c for c in topo.components if topo.components[c].kind.value == "node")[:3]
    eng = Engine(topo, coherence=True)
    for i, n in enumerate(nodes):
        nic = f"{n}-nic5"
        link = next(lid for lid in topo.links_of(nic) if topo.links[lid].kind == "ib")
        eng.observe_health_event(HealthEvent(f"d{i}", n, EventKind.LINK_DOWN, T0 + timedelta(seconds=i), nic,
                                             link=link))
        leaf = topo.links[link].other(nic)
    now = T0 + timedelta(seconds=5)
    assert leaf in {s.component for s in eng.suspects(now)}
    assert leaf not in {w.component for w in eng.watching(now, decades=6.0)}


def test_reading_the_list_at_the_controllers_clock_past_the_stream_changes_no_verdict(rack: Topology) -> None:
    """A review's case: witnesses spread over the window, the list read at the controller's clock a few
    seconds past the stream, then a late event stamped before that clock. The list must not drop a witness
    the late event still counts: its verdict is the one without the list."""
    from dataclasses import replace

    trays = sorted(c for c in rack.components if rack.components[c].kind.value == "compute_tray")
    base = [one_error(rack, t, i % 4, i) for i, t in enumerate(trays[:16])]
    compared = 0
    for n in range(3, 14):
        evs = [replace(base[i], time=T0 + timedelta(seconds=int(880 * i / (n - 1)))) for i in range(n)]
        late = replace(base[n], time=T0 + timedelta(seconds=899))
        got = []
        for ask in (False, True):
            eng = Engine(rack, coherence=True)
            first = [v.suspect.component for e in evs for v in eng.observe_health_event(e)]
            if ask:
                eng.watching(T0 + timedelta(seconds=905))
            got.append((first, [v.suspect.component for v in eng.observe_health_event(late)]))
        assert got[0] == got[1], n
        compared += bool(got[0][1])
    assert compared  # some late event made a verdict: the case was exercised


def test_without_coherence_nothing_is_watched(rack: Topology) -> None:
    eng = Engine(rack, coherence=False)
    eng.observe_health_event(one_error(rack, "r01-ct01", 0, 0))
    assert eng.watching(T0 + timedelta(minutes=1)) == []


@pytest.mark.parametrize("kind", [TopologyKind.HGX, TopologyKind.NVL72])
def test_asking_for_the_watch_list_after_every_event_changes_no_verdict(kind: TopologyKind) -> None:
    """The watch list scores candidates in full (it updates their stored p): the verdicts streamed with it
    asked after every event are the verdicts streamed without it, on weak faults in heavy noise."""
    topo = weak_topology(kind)
    watched = 0
    for fault in WEAK_FAULTS[kind][:5]:
        sc = generate_weak(topo, kind, fault, Noise.HEAVY, 1, Split.TUNE)
        plain, asked = Engine(topo, coherence=True), Engine(topo, coherence=True)
        for ev in sc.events:
            assert asked.observe(ev) == plain.observe(ev), (fault, ev)
            rows = asked.watching(ev.time)
            watched += len(rows)
            standing = {s.component for s in asked.suspects() if s.finding.value != "alternative"}
            assert all(0 < w.decades <= WATCH_DECADES and w.component not in standing for w in rows)
    assert watched > 0  # heavy noise leaves patterns near the line: the property was exercised
