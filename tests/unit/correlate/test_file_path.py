"""The engine's file path (``read_event_fields`` -> ``observe_fields``) gives what ``observe`` gives."""

from __future__ import annotations

import pytest

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Verdict
from gpufleet.correlate.scenarios import FAULTS, Noise, TopologyKind, generate
from gpufleet.domain.eventio import format_event, read_event_fields
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72


@pytest.fixture(scope="module")
def topologies() -> dict[TopologyKind, Topology]:
    return {TopologyKind.HGX: generate_hgx(8), TopologyKind.NVL72: generate_nvl72(1)}


@pytest.mark.parametrize("kind", list(TopologyKind))
def test_fields_path_gives_the_same_verdicts_as_file_events(
    topologies: dict[TopologyKind, Topology], kind: TopologyKind
) -> None:
    topo = topologies[kind]
    verdicts_seen = 0
    for fault in FAULTS[kind]:
        sc = generate(topo, kind, fault, Noise.HEAVY, 7)
        by_event, by_fields = Engine(topo), Engine(topo)
        expected: list[tuple[int, list[Verdict]]] = [(ev.line, by_event.observe(ev)) for ev in sc.events]
        lines = [format_event(ev) for ev in sc.events]
        got = [(f[0], by_fields.observe_fields(f)) for f in read_event_fields(lines)]
        # the scenario numbers its events from 1 as the file reader does, so line numbers match one to one
        assert got == expected
        assert by_fields.suspects() == by_event.suspects()
        assert (by_fields.unknown, by_fields.late) == (by_event.unknown, by_event.late)
        verdicts_seen += sum(len(v) for _, v in got)
    assert verdicts_seen > 0  # the comparison covered streams that produced verdicts
