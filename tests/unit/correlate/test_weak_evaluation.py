"""The weak-signal suite on its held-out split: thresholds are the measured numbers of the engine
(docs/benchmarks.md §correlate, 20 seeds), so a regression fails here; the goals (top-1 >= 97 %) are
not met yet and live in the benchmark, not in this test."""

from __future__ import annotations

import pytest

from gpufleet.correlate.scenarios import Noise, TopologyKind
from gpufleet.correlate.scoring import Score, closest, score, summary
from gpufleet.correlate.weak import WEAK_FAULTS, Split, WeakFault, generate_weak, weak_topology
from gpufleet.domain.errors import InvalidInput

# measured on the held-out split, realistic noise, 20 seeds per fault type (top-1 overall; per fault).
# HGX node 0.75 -> 0.65, NVSwitch chip 0.8 -> 0.85, degrading 0.95 -> 1.0 with decision 0114 (a node is not
# blamed for its chip's pattern: two node faults whose GPUs' errors fell mostly on one chip now name it);
# node 0.65 -> 0.75, overall 0.76 -> 0.78 with decision 0116 (the chip accounts only for the reports about it);
# IB cables 0.7 -> 0.75 (HGX), 0.6 -> 0.65 (NVL72) with decision 0118 (a NIC end at its link-naming rate).
MEASURED = {
    TopologyKind.HGX: (0.78, {"nvswitch": 0.85, "leaf": 0.95, "node": 0.75, "ib_cable": 0.75, "nic_follows": 1.0,
                              "cable_stays": 1.0, "degrading": 1.0}),
    TopologyKind.NVL72: (0.72, {"nvswitch": 1.0, "switch_tray": 1.0, "leaf": 0.85, "compute_tray": 0.45,
                                "tray_follows": 0.75, "cable_stays": 0.85, "ib_cable": 0.65}),
}
# The same in heavy noise (decision 0116 traded an HGX degrading chip's 0.9 for 0.8 here: two chips whose
# GPUs also carried the noise's reports towards other chips are named as their node).
MEASURED_HEAVY = {
    TopologyKind.HGX: (0.66, {"degrading": 0.8, "node": 0.85, "nvswitch": 0.65, "cable_stays": 0.95, "ib_cable": 0.3}),
    TopologyKind.NVL72: (0.59, {"degrading": 1.0, "nvswitch": 1.0, "switch_tray": 1.0, "leaf": 0.85}),
}
_RUNS: dict[tuple[TopologyKind, bool, Noise], Score] = {}


def _run(kind: TopologyKind, coherence: bool = True, noise: Noise = Noise.REALISTIC) -> Score:
    if (kind, coherence, noise) not in _RUNS:
        topo = weak_topology(kind)
        scs = [generate_weak(topo, kind, f, noise, s, Split.HELDOUT) for f in WEAK_FAULTS[kind] for s in range(20)]
        _RUNS[(kind, coherence, noise)] = score(topo, scs, coherence=coherence)
    return _RUNS[(kind, coherence, noise)]


@pytest.mark.parametrize("kind", list(TopologyKind))
def test_heldout_weak_suite_holds_the_measured_accuracy(kind: TopologyKind) -> None:
    res = _run(kind)
    overall, per_fault = MEASURED[kind]
    assert res.top1() >= overall - 1e-9, [(o.scenario, o.truth, o.top) for o in res.misses()]
    by = res.by(1)
    for fault, floor in per_fault.items():
        assert by[fault][1] >= floor - 1e-9, (fault, by[fault])


@pytest.mark.parametrize("kind", list(TopologyKind))
def test_heldout_weak_suite_holds_the_measured_accuracy_in_heavy_noise(kind: TopologyKind) -> None:
    res = _run(kind, noise=Noise.HEAVY)
    overall, per_fault = MEASURED_HEAVY[kind]
    assert res.top1() >= overall - 1e-9, [(o.scenario, o.truth, o.top) for o in res.misses()]
    by = res.by(1)
    for fault, floor in per_fault.items():
        assert by[fault][1] >= floor - 1e-9, (fault, by[fault])
    assert res.wrong_switch_scenarios() == 0 and res.false_alarms() == 0


@pytest.mark.parametrize("kind", list(TopologyKind))
def test_no_false_alarm_and_no_healthy_switch_blamed(kind: TopologyKind) -> None:
    res = _run(kind)
    assert res.noise_windows() == 20
    assert res.false_alarms() == 0
    assert res.wrong_switch_scenarios() == 0


@pytest.mark.parametrize("kind", list(TopologyKind))
def test_each_miss_says_how_close_its_truth_came(kind: TopologyKind) -> None:
    """A chip or leaf fault gives only weak events, and nothing inside a chip or a leaf has a pattern of
    its own: the truth is blamed only through its own coherence pattern, so a hit's truth was significant
    at some event (closest > 0). (A switch or compute tray can be named through its chips' or GPUs'
    patterns with its own short of alpha: nvl72/switch_tray/realistic/0.) A miss whose truth was
    significant once was ranked or streamed. The report lists one closest approach per miss."""
    res = _run(kind)
    weak_only = {"nvswitch", "leaf"}
    checked = 0
    for o in res.outcomes:
        if o.scenario.split("/")[1] not in weak_only:
            continue
        checked += 1
        if o.top1:
            assert o.closest is not None and o.closest > 0, o
        elif o.closest is not None and o.closest > 0:
            assert o.truth in o.top or o.verdicts > 0, o  # significant once: it was ranked or streamed
    assert checked >= 40
    doc = summary(res)
    listed = doc["miss_closest_by_fault"]
    assert isinstance(listed, dict) and doc["misses_by_fault"] == {f: len(v) for f, v in listed.items()}
    for values in listed.values():
        known = [v for v in values if v is not None]
        assert known == sorted(known, reverse=True) and values[len(known):] == [None] * (len(values) - len(known))


def test_closest_in_words() -> None:
    assert closest(None).startswith("never scored")
    assert closest(-0.5) == "closest 0.50 decades short of alpha"
    assert closest(1.25).startswith("significant at some event (log10 alpha/p 1.25)")


def test_coherence_beats_counts_only_on_weak_signals() -> None:
    kind = TopologyKind.NVL72
    old, new = _run(kind, coherence=False), _run(kind)
    assert old.by(1)["nvswitch"][1] == 0.0  # the count path cannot see one error per reporter
    assert new.top1() >= old.top1() + 0.3


def test_degrading_chips_are_named_before_they_fail() -> None:
    leads = _run(TopologyKind.NVL72).leads()
    named = [x for x in leads if x is not None]
    assert len(leads) == 20 and len(named) >= 15  # measured 15/20
    assert sorted(named)[len(named) // 2] >= 60.0  # median lead measured 189 s


def test_splits_are_different_streams_and_noise_only_needs_noise() -> None:
    topo = weak_topology(TopologyKind.HGX)
    a = generate_weak(topo, TopologyKind.HGX, WeakFault.NVSWITCH, Noise.REALISTIC, 1, Split.TUNE)
    b = generate_weak(topo, TopologyKind.HGX, WeakFault.NVSWITCH, Noise.REALISTIC, 1, Split.HELDOUT)
    assert a.events != b.events and a.split == "tune" and b.split == "heldout"
    with pytest.raises(InvalidInput) as err:
        generate_weak(topo, TopologyKind.HGX, WeakFault.NOISE_ONLY, Noise.NONE, 0)
    assert err.value.field == "noise"
    with pytest.raises(InvalidInput):
        generate_weak(topo, TopologyKind.HGX, WeakFault.SWITCH_TRAY, Noise.REALISTIC, 0)
