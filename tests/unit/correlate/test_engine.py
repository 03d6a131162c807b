"""The engine on hand-written streams: each localisation rule, noise, folding, damping, moves, windows."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Basis, SuspectAction, Verdict, VerdictStatus
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.events import HealthEvent
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72
from tests.unit.correlate.helpers import T0, Stream


@pytest.fixture(scope="module")
def hgx() -> Topology:
    return generate_hgx(64)


@pytest.fixture(scope="module")
def nvl() -> Topology:
    return generate_nvl72(2)


def _run(topo: Topology, s: Stream) -> tuple[Engine, list[Verdict]]:
    eng = Engine(topo)
    out: list[Verdict] = []
    for ev in s.events:
        out.extend(eng.observe(ev))
    return eng, out


def test_many_nodes_under_one_leaf_blame_the_leaf_once(hgx: Topology) -> None:
    s = Stream()
    nodes = ["r01-n01", "r02-n03", "r04-n02", "r05-n04", "r08-n01"]  # all in SU 1
    lines = [
        s.add(10 + i, E.LINK_DOWN, f"{n}-nic3", link=f"{n}-nic3~leaf-su1-r3") for i, n in enumerate(nodes)
    ]
    eng, verdicts = _run(hgx, s)
    top = eng.suspects()[0]
    assert top.component == "leaf-su1-r3" and top.kind == "leaf_switch"
    assert top.action is SuspectAction.DRAIN_AND_REPLACE
    assert set(lines) <= set(top.evidence)
    assert set(nodes) <= set(top.affected_nodes) and len(top.affected_nodes) == 32
    leaf_verdicts = [v for v in verdicts if v.suspect.component == "leaf-su1-r3"]
    assert leaf_verdicts[0].status is VerdictStatus.NEW
    # one decision: no per-node verdict is left standing
    assert {x.component for x in eng.emitted()} == {"leaf-su1-r3"}


def test_two_unrelated_cables_never_frame_their_leaf(hgx: Topology) -> None:
    s = Stream()
    s.add(10, E.LINK_DOWN, "r01-n01-nic3", link="r01-n01-nic3~leaf-su1-r3")
    s.add(50, E.LINK_DOWN, "r03-n02-nic3", link="r03-n02-nic3~leaf-su1-r3")
    eng, verdicts = _run(hgx, s)
    blamed = {v.suspect.component for v in verdicts} | {
        x.component for x in eng.suspects() if x.action is not SuspectAction.OBSERVE
    }
    assert "leaf-su1-r3" not in blamed


def test_errors_at_both_ends_of_a_cable_blame_the_cable(hgx: Topology) -> None:
    s = Stream()
    link = "r02-n01-nic6~leaf-su1-r6"
    for i in range(60):
        s.add(i * 5, E.LINK_ERROR, "r02-n01-nic6", link=link)
        s.add(i * 5 + 1, E.LINK_ERROR, "leaf-su1-r6", link=link)
    eng, _ = _run(hgx, s)
    top = eng.suspects()[0]
    assert top.component == link and top.kind == "ib" and top.serial is None
    assert top.action is SuspectAction.CHECK_CABLING
    assert top.affected_nodes == ("r02-n01",)


def test_many_gpus_on_one_nvswitch_chip_blame_the_chip(nvl: Topology) -> None:
    s = Stream()
    chip = "r01-sw4-nvsw1"
    for t in range(1, 11):  # GPU 0 of ten different trays
        gpu = f"r01-ct{t:02d}-gpu0"
        s.add(t, E.XID, gpu, code=149, link=f"{gpu}~{chip}")
        s.add(t + 0.5, E.XID, gpu, code=45)  # collateral
    eng, _ = _run(nvl, s)
    top = eng.suspects()[0]
    assert top.component == chip and top.kind == "nvswitch"
    assert top.action is SuspectAction.DRAIN_AND_REPLACE
    assert len(top.affected_nodes) == 18  # every tray of the rack uses every chip
    assert 1 in top.evidence  # the collateral XID 45 is folded into the root's evidence


def test_one_trays_gpus_across_many_links_blame_the_tray_not_the_chips(nvl: Topology) -> None:
    s = Stream()
    tray = "r02-ct05"
    at = 0.0
    for g in range(4):
        for chip in ("r02-sw1-nvsw0", "r02-sw3-nvsw1", "r02-sw5-nvsw0", "r02-sw8-nvsw1", "r02-sw9-nvsw0"):
            at += 1
            s.add(at, E.XID, f"{tray}-gpu{g}", code=149, link=f"{tray}-gpu{g}~{chip}")
    eng, verdicts = _run(nvl, s)
    assert eng.suspects()[0].component == tray
    assert not [v for v in verdicts if v.suspect.kind == "nvswitch" and v.status is not VerdictStatus.CLEARED]


def test_gpu_fault_with_collateral_is_one_suspect(hgx: Topology) -> None:
    s = Stream()
    a = s.add(5, E.XID, "r03-n02-gpu6", code=79)
    b = s.add(6, E.XID, "r03-n02-gpu6", code=45)
    eng, verdicts = _run(hgx, s)
    ranked = eng.suspects()
    assert ranked[0].component == "r03-n02-gpu6"
    assert ranked[0].evidence == (a, b)
    assert [v.suspect.component for v in verdicts] == ["r03-n02-gpu6"]
    assert [x.component for x in ranked if x.action is not SuspectAction.OBSERVE] == ["r03-n02-gpu6"]


def test_application_xids_and_scattered_corrected_errors_are_not_faults(hgx: Topology) -> None:
    s = Stream()
    for i, gpu in enumerate(["r01-n01-gpu0", "r02-n02-gpu3", "r05-n01-gpu7", "r09-n04-gpu2", "r12-n03-gpu1"]):
        s.add(i * 10, E.XID, gpu, code=(13, 31, 43, 43, 13)[i])
        s.add(i * 10 + 1, E.XID, gpu, code=45)
        s.add(i * 10 + 2, E.ECC_SBE, gpu)
        s.add(
            i * 10 + 3,
            E.LINK_ERROR,
            gpu.replace("gpu", "nic"),
            link=f"{gpu.replace('gpu', 'nic')}~leaf-su{1 + (i >= 3)}-r{gpu[-1]}",
        )
    eng, verdicts = _run(hgx, s)
    assert verdicts == []
    assert eng.suspects() == []


def test_flapping_cable_is_damped(hgx: Topology) -> None:
    s = Stream()
    link = "r06-n01-nic2~leaf-su1-r2"
    for i in range(200):
        s.add(i * 3.0, E.LINK_FLAP, "r06-n01-nic2", link=link)
        s.add(i * 3.0 + 0.2, E.LINK_FLAP, "leaf-su1-r2", link=link)
    eng, verdicts = _run(hgx, s)
    assert eng.suspects()[0].component == link
    assert len(verdicts) <= 3  # 400 events, a handful of verdict changes at most


@pytest.mark.parametrize("faulty_first", [True, False])
def test_pattern_that_follows_a_moved_tray_blames_the_unit(nvl: Topology, faulty_first: bool) -> None:
    a, b = "r01-ct03", "r02-ct07"
    serial_a = nvl.components[a].serial
    s = _tray_storm(Stream(), a, 0)
    # a swap is two moves; whichever half the controller sees first, the verdict is the same
    moves = [(serial_a, a, b), (nvl.components[b].serial, b, a)]
    for i, (serial, src, dst) in enumerate(moves if faulty_first else moves[::-1]):
        s.add(600 + i, E.MOVED, serial=serial, src=src, dst=dst)
    _tray_storm(s, b, 900)
    eng, _ = _run(nvl, s)
    top = eng.suspects()[0]
    assert top.component == b and top.serial == serial_a
    assert top.finding is Basis.FOLLOWS_SERIAL
    assert top.action is SuspectAction.DRAIN_AND_REPLACE
    assert 0 in top.evidence  # the pre-move evidence at the old slot is part of the case


def test_pattern_that_stays_at_the_slot_blames_the_slot_cabling(nvl: Topology) -> None:
    a, b = "r01-ct03", "r02-ct07"
    s = _tray_storm(Stream(), a, 0)
    s.add(600, E.MOVED, serial=nvl.components[a].serial, src=a, dst=b)
    s.add(601, E.MOVED, serial=nvl.components[b].serial, src=b, dst=a)
    _tray_storm(s, a, 900)
    eng, verdicts = _run(nvl, s)
    top = eng.suspects()[0]
    assert top.component == a and top.serial == nvl.components[b].serial
    assert top.finding is Basis.STAYS_AT_SLOT
    assert top.action is SuspectAction.CHECK_CABLING
    # the verdict on the first unit was cleared when it left the slot
    statuses = [(v.status, v.suspect.action) for v in verdicts if v.suspect.component == a]
    assert (VerdictStatus.CLEARED, SuspectAction.DRAIN_AND_INSPECT) in statuses


def _tray_storm(s: Stream, tray: str, at: float) -> Stream:
    for g in range(4):
        for chip in (
            ("r01-sw2-nvsw0", "r01-sw6-nvsw1", "r01-sw7-nvsw0")
            if tray.startswith("r01")
            else ("r02-sw2-nvsw0", "r02-sw6-nvsw1", "r02-sw7-nvsw0")
        ):
            at += 2
            s.add(at, E.XID, f"{tray}-gpu{g}", code=149, link=f"{tray}-gpu{g}~{chip}")
    return s


def test_evidence_ages_out_of_the_window(hgx: Topology) -> None:
    eng = Engine(hgx, window=timedelta(minutes=10))
    s = Stream()
    s.add(0, E.XID, "r01-n01-gpu1", code=79)
    s.add(1200, E.XID, "r09-n01-gpu4", code=48)
    first = eng.observe(s.events[0])
    assert [v.status for v in first] == [VerdictStatus.NEW]
    later = eng.observe(s.events[1])
    assert (VerdictStatus.CLEARED, "r01-n01-gpu1") in [(v.status, v.suspect.component) for v in later]
    assert [x.component for x in eng.suspects(T0 + timedelta(minutes=40))] == []


def test_late_events_are_counted_not_used(hgx: Topology) -> None:
    eng = Engine(hgx, window=timedelta(minutes=10))
    s = Stream()
    s.add(3600, E.XID, "r01-n01-gpu1", code=79)
    s.add(0, E.XID, "r02-n01-gpu1", code=79)
    for ev in s.events:
        eng.observe(ev)
    assert eng.late == 1
    assert {x.component for x in eng.suspects()} >= {"r01-n01-gpu1"}
    assert "r02-n01-gpu1" not in {x.component for x in eng.suspects()}


def test_unknown_components_are_counted(hgx: Topology) -> None:
    eng = Engine(hgx)
    s = Stream()
    s.add(1, E.XID, "r99-n99-gpu0", code=79)
    s.add(2, E.LINK_DOWN, "r01-n01-nic0", link="no-such-link")
    for ev in s.events:
        eng.observe(ev)
    assert eng.unknown == 2


def test_controller_health_events_use_component_or_node(hgx: Topology) -> None:
    eng = Engine(hgx)
    v1 = eng.observe_health_event(
        HealthEvent(id="ev-1", node="r01-n02", kind=E.XID, time=T0, component="r01-n02-gpu3", code=79)
    )
    assert [v.suspect.component for v in v1] == ["r01-n02-gpu3"]
    assert v1[0].suspect.evidence == ("ev-1",)
    # a component the topology does not know (a PCI address) falls back to the node
    eng.observe_health_event(
        HealthEvent(id="ev-2", node="r05-n01", kind=E.HEARTBEAT_LOST, time=T0, component="0000:18:00.0")
    )
    assert "r05-n01" in {x.component for x in eng.suspects()}


def test_hgx_gpus_on_one_nvswitch_chip_blame_the_chip_not_the_node(hgx: Topology) -> None:
    s = Stream()
    node, chip = "r07-n02", "r07-n02-nvsw2"
    for g in (0, 2, 3, 5, 7):
        s.add(g, E.XID, f"{node}-gpu{g}", code=74, link=f"{node}-gpu{g}~{chip}")
    s.add(9, E.SXID, chip, code=20034, link=f"{node}-gpu0~{chip}")
    eng, _ = _run(hgx, s)
    top = eng.suspects()[0]
    assert (top.component, top.kind) == (chip, "nvswitch")
    assert top.affected_nodes == (node,)


def test_many_leaves_losing_uplinks_to_one_spine_isolate_the_spine(hgx: Topology) -> None:
    s = Stream()
    spine = "spine-r4-1"  # 64 nodes = 2 SUs: rail 4 has two leaves under this spine
    for i, leaf in enumerate(("leaf-su1-r4", "leaf-su2-r4")):
        for k in (1, 5, 9):
            s.add(i * 10 + k, E.LINK_DOWN, leaf, link=f"{leaf}~{spine}#{k}")
    eng, _ = _run(hgx, s)
    top = eng.suspects()[0]
    assert top.component == spine
    assert top.action is SuspectAction.ISOLATE_SWITCH
    assert top.affected_nodes == ()  # the fat-tree routes around a spine: nothing to drain


def test_an_unjudged_decoded_nvlink5_row_is_judged_by_its_row(hgx: Topology) -> None:
    # Decision 0031: a BER-event row (Non-fatal, IGNORE) is info, so the engine folds it; the same Xid
    # without a decoded row is judged at the Xid's own entry (degraded) and makes a suspect.
    eng = Engine(hgx)
    ber = (("nvl5_row", "NETIR_BER_EVENT:0x00000001:000000"),)
    eng.observe_health_event(HealthEvent(id="b1", node="r01-n02", kind=E.XID, time=T0, component="r01-n02-gpu3",
                                         code=149, attrs=ber))
    assert "r01-n02-gpu3" not in {x.component for x in eng.suspects()}
    eng.observe_health_event(HealthEvent(id="b2", node="r01-n02", kind=E.XID, time=T0, component="r01-n02-gpu3",
                                         code=149))
    assert "r01-n02-gpu3" in {x.component for x in eng.suspects()}
