"""A unit is not blamed for the pattern of one part inside it (``Coherence.explained_away``, decision
0114): an HGX node whose NVSwitch chip degrades, plus a few background reports from elsewhere in the
node, is the chip's fault; the node stands on its own only when the rest of its witnesses are beyond
the background too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction, VerdictStatus
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx

HGX: Topology = generate_hgx(64)
T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
NODE, CHIP = "r05-n02", "r05-n02-nvsw1"


def _stream(chip_gpus: int, nic_reports: int) -> list[HealthEvent]:
    """``chip_gpus`` GPUs each log one corrected error on their link to CHIP (30 s apart), and
    ``nic_reports`` of the node's NICs one corrected AER each (40 s apart): background inside the node."""
    out = []
    for i, lid in enumerate(HGX.links_of(CHIP)[:chip_gpus]):
        gpu = HGX.links[lid].other(CHIP)
        out.append(HealthEvent(f"c{i}", NODE, EventKind.LINK_ERROR, T0 + timedelta(seconds=30 * i), gpu, link=lid))
    for i in range(nic_reports):
        out.append(HealthEvent(f"n{i}", NODE, EventKind.AER_CORRECTED, T0 + timedelta(seconds=15 + 40 * i),
                               f"{NODE}-nic{i}"))
    return sorted(out, key=lambda e: e.time)


def _standing(events: list[HealthEvent]) -> tuple[Engine, set[str]]:
    engine = Engine(HGX)
    for e in events:
        engine.observe_health_event(e)
    return engine, {s.component for s in engine.emitted() if s.action is not SuspectAction.OBSERVE}


@pytest.mark.parametrize("chip_gpus", [4, 5, 6])
@pytest.mark.parametrize("nic_reports", [0, 1])
def test_the_chip_is_named_not_its_node(chip_gpus: int, nic_reports: int) -> None:
    engine, standing = _standing(_stream(chip_gpus, nic_reports))
    assert standing == {CHIP}  # before decision 0114: the node, as soon as one NIC had reported too
    assert engine.suspects()[0].component == CHIP
    coh = engine.coherence
    assert coh is not None and coh.is_significant(CHIP)
    if coh.is_significant(NODE):
        assert coh.explained_away(NODE, (T0 + timedelta(minutes=5)).timestamp())


@pytest.mark.parametrize("nic_reports", [2, 4])
def test_the_node_stands_when_the_rest_of_it_is_beyond_the_background_too(nic_reports: int) -> None:
    # Two or more of its NICs within minutes: rarer than 1 window in 20 under the background (here the
    # cold start's prior), so the node has a pattern of its own besides the chip's.
    engine, standing = _standing(_stream(5, nic_reports))
    assert NODE in standing
    coh = engine.coherence
    assert coh is not None and coh.is_significant(CHIP) and coh.is_significant(NODE)
    assert not coh.explained_away(NODE, (T0 + timedelta(minutes=5)).timestamp())


def test_a_unit_with_no_significant_part_is_not_explained_away() -> None:
    engine, _ = _standing(_stream(0, 6))
    coh = engine.coherence
    assert coh is not None and not coh.explained_away(NODE, (T0 + timedelta(minutes=5)).timestamp())
    assert not coh.explained_away(CHIP, (T0 + timedelta(minutes=5)).timestamp())  # a chip is no unit


def test_a_part_is_judged_on_its_witnesses_inside_the_window_not_on_an_old_flag() -> None:
    """The chip's five GPUs report at 0:00-1:20 and it is named; 18 minutes later the same five GPUs log
    corrected AERs, a pattern of the node's own. The chip's witnesses have left the window by then: it
    no longer explains the node (it did while its flag from 0:01 was trusted: the node went unnamed)."""
    events = []
    for i, lid in enumerate(HGX.links_of(CHIP)[:5]):
        gpu = HGX.links[lid].other(CHIP)
        events.append(HealthEvent(f"c{i}", NODE, EventKind.LINK_ERROR, T0 + timedelta(seconds=20 * i + 1), gpu,
                                  link=lid))
        events.append(HealthEvent(f"a{i}", NODE, EventKind.AER_CORRECTED, T0 + timedelta(minutes=18, seconds=30 * i),
                                  gpu))
    # Elsewhere in the fleet, at 15:10: the coherence sweep runs while the chip's witnesses are in the window.
    events.append(HealthEvent("bg", "r01-n01", EventKind.AER_CORRECTED, T0 + timedelta(minutes=15, seconds=10),
                              "r01-n01-nic0"))
    engine, standing = _standing(sorted(events, key=lambda e: e.time))
    assert NODE in standing
    coh = engine.coherence
    assert coh is not None and not coh.explained_away(NODE, (T0 + timedelta(minutes=20)).timestamp())


def test_a_part_that_keeps_erring_does_not_churn_the_verdicts() -> None:
    """Five GPUs err towards the chip every minute for 20 minutes, and four of the node's NICs report in
    the first three: the chip stands throughout (one NEW, never CLEARED); the node, named for its NICs,
    is re-explained once their witnesses leave the window, not at every new chip witness."""
    events = [HealthEvent(f"c{m}-{i}", NODE, EventKind.LINK_ERROR, T0 + timedelta(seconds=60 * m + 10 * i),
                          HGX.links[lid].other(CHIP), link=lid)
              for m in range(20) for i, lid in enumerate(HGX.links_of(CHIP)[:5])]
    events += [HealthEvent(f"n{i}", NODE, EventKind.AER_CORRECTED, T0 + timedelta(seconds=15 + 40 * i),
                           f"{NODE}-nic{i}") for i in range(4)]
    engine = Engine(HGX)
    changes = [(v.status, v.suspect.component) for e in sorted(events, key=lambda e: e.time)
               for v in engine.observe_health_event(e)]
    chip = [status for status, comp in changes if comp == CHIP]
    assert chip == [VerdictStatus.NEW]
    assert len(changes) <= 4, changes


def _node_confidence(chip_gpus: int, nic_times: list[float]) -> float:
    events = _stream(chip_gpus, 0)
    events += [HealthEvent(f"n{i}", NODE, EventKind.AER_CORRECTED, T0 + timedelta(seconds=at), f"{NODE}-nic{i}")
               for i, at in enumerate(nic_times)]
    engine, _ = _standing(sorted(events, key=lambda e: e.time))
    return max((s.confidence for s in engine.suspects() if s.component == NODE), default=0.0)


@settings(max_examples=40, deadline=None)
@given(chip_gpus=st.integers(0, 6), nic_times=st.lists(st.floats(0, 300), max_size=6), at=st.floats(0, 300))
def test_a_witness_of_the_units_own_never_lowers_its_confidence(chip_gpus: int, nic_times: list[float],
                                                                 at: float) -> None:
    """One more of the node's NICs reporting is evidence for the node beyond its chip: it can only make
    the node's pattern its own. (A witness of the chip can lower the node's confidence — that is the
    explaining away — so the property is stated for the unit's own witnesses.)"""
    before = _node_confidence(chip_gpus, nic_times)
    after = _node_confidence(chip_gpus, [*nic_times, at])
    assert after >= before - 1e-9, (before, after)


OTHER = "r05-n02-nvsw2"


def _spread(chip_gpus: int, also_other: int) -> list[HealthEvent]:
    """``chip_gpus`` GPUs each log one corrected error on their link to CHIP (30 s apart); the first
    ``also_other`` of them also one on their link to another chip of the node, 10 s later."""
    out = []
    for i, lid in enumerate(HGX.links_of(CHIP)[:chip_gpus]):
        gpu = HGX.links[lid].other(CHIP)
        at = T0 + timedelta(seconds=30 * i)
        out.append(HealthEvent(f"c{i}", NODE, EventKind.LINK_ERROR, at, gpu, link=lid))
        if i < also_other:
            other = next(x for x in HGX.links_of(gpu) if HGX.links[x].other(gpu) == OTHER)
            out.append(HealthEvent(f"o{i}", NODE, EventKind.LINK_ERROR, at + timedelta(seconds=10), gpu, link=other))
    return out


@pytest.mark.parametrize("chip_gpus", [5, 6])
@pytest.mark.parametrize("also_other", [2, 3])
def test_a_chips_witness_erring_towards_another_chip_too_is_left_to_its_node(chip_gpus: int, also_other: int) -> None:
    """A node fault whose GPUs erred mostly towards one chip: the chip accounts for their reports on
    links to it, not for their reports towards another chip, which stay the node's own pattern (before,
    every report of a GPU that had witnessed the chip went with it, and the chip was blamed)."""
    engine, standing = _standing(_spread(chip_gpus, also_other))
    coh = engine.coherence
    assert coh is not None and coh.is_significant(CHIP) and not coh.is_significant(OTHER)
    assert not coh.explained_away(NODE, (T0 + timedelta(minutes=5)).timestamp())
    assert standing == {NODE}


@pytest.mark.parametrize("chip_gpus", [5, 6])
def test_one_report_towards_another_chip_leaves_the_chip_named(chip_gpus: int) -> None:
    engine, standing = _standing(_spread(chip_gpus, 1))  # one such GPU is what the background gives
    coh = engine.coherence
    assert coh is not None and coh.explained_away(NODE, (T0 + timedelta(minutes=5)).timestamp())
    assert standing == {CHIP}


def test_the_units_own_reports_are_never_its_parts() -> None:
    """An event naming only the node (its agent could not place it on a component) is the node's own
    report, one witness per kind ("self:<kind>"): the chip does not account for it."""
    events = [*_stream(5, 1), HealthEvent("s0", NODE, EventKind.AER_CORRECTED, T0 + timedelta(seconds=20), None)]
    engine, standing = _standing(sorted(events, key=lambda e: e.time))
    coh = engine.coherence
    assert coh is not None and coh.is_significant(CHIP)
    assert not coh.explained_away(NODE, (T0 + timedelta(minutes=5)).timestamp())
    assert NODE in standing


def test_a_residual_witness_is_dated_by_its_own_unexplained_report() -> None:
    """A GPU that erred towards another chip twelve minutes ago and towards the chip just now is in the
    node's residual as of its old report: the chip's fresh evidence does not put it on the short scale."""
    gpu = HGX.links[HGX.links_of(CHIP)[0]].other(CHIP)
    other = next(x for x in HGX.links_of(gpu) if HGX.links[x].other(gpu) == OTHER)
    old = T0 - timedelta(minutes=12)
    events = [HealthEvent("o", NODE, EventKind.LINK_ERROR, old, gpu, link=other), *_stream(5, 0)]
    engine, _ = _standing(events)
    coh = engine.coherence
    assert coh is not None
    st = coh._cands[NODE]
    assert not isinstance(st, tuple)
    t = (T0 + timedelta(minutes=2)).timestamp()
    rest = coh._unaccounted(NODE, st, {CHIP}, t - coh.window)
    assert set(rest) == {gpu}
    assert rest[gpu][0] == old.timestamp() < st.wit[gpu][0]
