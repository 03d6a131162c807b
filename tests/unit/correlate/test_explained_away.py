"""A unit is not blamed for the pattern of one part inside it (``Coherence.explained_away``, decision
0114): an HGX node whose NVSwitch chip degrades, plus a few background reports from elsewhere in the
node, is the chip's fault; the node stands on its own only when the rest of its witnesses are beyond
the background too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction
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
