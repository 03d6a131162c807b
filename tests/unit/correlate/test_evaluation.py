"""The evaluation harness at small scale: the accuracy goals hold on generated scenarios."""

from __future__ import annotations

import pytest

from gpufleet.correlate.scenarios import FAULTS, FaultType, Noise, TopologyKind, generate
from gpufleet.correlate.scoring import score
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72

TOPOS: dict[TopologyKind, Topology] = {}


def _topo(kind: TopologyKind) -> Topology:
    if kind not in TOPOS:
        TOPOS[kind] = generate_hgx(64) if kind is TopologyKind.HGX else generate_nvl72(2)
    return TOPOS[kind]


@pytest.mark.parametrize("kind", list(TopologyKind))
def test_realistic_noise_top1_at_least_97_percent_and_no_healthy_switch_blamed(kind: TopologyKind) -> None:
    topo = _topo(kind)
    scs = [generate(topo, kind, f, Noise.REALISTIC, seed) for f in FAULTS[kind] for seed in range(4)]
    result = score(topo, scs)
    assert result.top1() >= 0.97, [(o.scenario, o.truth, o.top) for o in result.misses()]
    assert result.wrong_switch_scenarios() == 0


def test_without_noise_every_fault_type_is_found_first() -> None:
    for kind in TopologyKind:
        topo = _topo(kind)
        result = score(topo, [generate(topo, kind, f, Noise.NONE, 11) for f in FAULTS[kind]])
        assert result.misses() == []


def test_scenarios_are_reproducible_and_carry_ground_truth() -> None:
    topo = _topo(TopologyKind.NVL72)
    a = generate(topo, TopologyKind.NVL72, FaultType.NVSWITCH, Noise.HEAVY, 3)
    b = generate(topo, TopologyKind.NVL72, FaultType.NVSWITCH, Noise.HEAVY, 3)
    c = generate(topo, TopologyKind.NVL72, FaultType.NVSWITCH, Noise.HEAVY, 4)
    assert a == b and a != c
    assert topo.components[a.truth].kind.value == "nvswitch"
    assert [e.line for e in a.events] == list(range(1, len(a.events) + 1))  # numbered like a file, from 1
    assert all(x.time <= y.time for x, y in zip(a.events, a.events[1:], strict=False))


def test_scorer_counts_a_wrong_answer() -> None:
    topo = _topo(TopologyKind.HGX)
    sc = generate(topo, TopologyKind.HGX, FaultType.LEAF, Noise.NONE, 0)
    wrong = type(sc)(sc.topology_kind, sc.fault, sc.noise, sc.seed, sc.events, "spine-r0-1", sc.onset)
    result = score(topo, [wrong])
    assert result.top1() == 0.0
    assert result.outcomes[0].wrong_switches == (sc.truth,)  # the real culprit is a "healthy" switch here


def test_fault_type_must_fit_the_topology() -> None:
    with pytest.raises(InvalidInput) as err:
        generate(_topo(TopologyKind.HGX), TopologyKind.HGX, FaultType.SWITCH_TRAY, Noise.NONE, 0)
    assert err.value.field == "fault" and err.value.value == "switch_tray"
