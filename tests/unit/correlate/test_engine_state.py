"""The engine's state is bounded by its window, and what it forgets was never cited again."""

from __future__ import annotations

import pytest

from gpufleet.correlate.engine import Engine
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72
from tests.unit.correlate.helpers import Stream


@pytest.fixture(scope="module")
def hgx() -> Topology:
    return generate_hgx(64)


def test_folded_evidence_is_cited_inside_the_window_only(hgx: Topology) -> None:
    s = Stream()
    old = s.add(0, E.XID, "r03-n02-gpu6", code=13)  # application error: folded, cited as evidence
    recent = s.add(25 * 60, E.XID, "r03-n02-gpu6", code=45)
    fault = s.add(40 * 60, E.XID, "r03-n02-gpu6", code=79)
    eng = Engine(hgx)
    for ev in s.events:
        eng.observe(ev)
    top = eng.suspects()[0]
    assert top.component == "r03-n02-gpu6"
    assert top.evidence == (recent, fault)
    assert old not in top.evidence


def test_folded_queues_of_quiet_components_are_forgotten(hgx: Topology) -> None:
    gpus = [c for c, comp in hgx.components.items() if comp.kind.value == "gpu"]
    s = Stream()
    for i, gpu in enumerate(gpus):  # every GPU of the fleet reports one application XID ...
        s.add(i * 0.01, E.XID, gpu, code=13)
    s.add(31 * 60, E.XID, gpus[0], code=31)  # ... and half an hour later only one of them
    eng = Engine(hgx)
    for ev in s.events:
        eng.observe(ev)
    assert len(gpus) > 100
    assert list(eng._folded) == [gpus[0]]
    assert len(eng._fold_queue) == 1


def test_expiry_skips_entries_of_symptoms_archived_by_a_move() -> None:
    nvl = generate_nvl72(1)
    trays = [c for c, comp in nvl.components.items() if comp.kind.value == "compute_tray"]
    tray, elsewhere = trays[0], trays[1]
    gpu = next(c for c, comp in nvl.components.items() if comp.parent == tray and comp.kind.value == "gpu")
    far_gpu = next(c for c, comp in nvl.components.items() if comp.parent == trays[2] and comp.kind.value == "gpu")
    one = Engine(nvl)
    s1 = Stream()
    s1.add(0, E.ECC_SBE, gpu)
    one.observe(s1.events[0])
    step = one._syms[(gpu, "")].weight  # the weight one corrected-ECC event adds
    s = Stream()
    s.add(0, E.ECC_SBE, gpu)  # a symptom on the GPU ...
    s.add(60, E.MOVED, serial=nvl.components[tray].serial, src=tray, dst=elsewhere)  # ... archived by the move
    s.add(120, E.ECC_SBE, gpu)  # a new symptom of the same key: the tray now in that slot
    s.add(31 * 60, E.ECC_SBE, far_gpu)  # the first entry leaves the window; the new one stays
    eng = Engine(nvl)
    for ev in s.events:
        eng.observe(ev)
    sym = eng._syms[(gpu, "")]
    assert 0 < step < 1
    assert sym.weight == pytest.approx(step)  # the archived symptom's expiry did not touch the new one
    assert sum(sym.counts) == 1
