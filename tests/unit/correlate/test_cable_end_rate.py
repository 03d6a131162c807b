"""A cable end with one link (a NIC) reports on its cable at its class's rate of *link-naming* reports
(decision 0118): its corrected AERs, which name no link, are background for the NIC itself but cannot
make it a witness of its cable. An end with many links (a leaf) keeps its rate of any report over its
links (decision 0115)."""

from __future__ import annotations

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.scenarios import TopologyKind
from gpufleet.correlate.weak import weak_topology
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.fleet import ComponentKind as K
from tests.unit.correlate.helpers import Stream

HGX = weak_topology(TopologyKind.HGX)
NICS = sorted(HGX.of_kind(K.NIC))
LEAVES = sorted(HGX.of_kind(K.LEAF_SWITCH))


def _spread(n: int, offset: int) -> list[str]:
    """``n`` NICs other than NICS[0], spread over the leaves (no leaf gathers a pattern)."""
    return [NICS[1 + (offset + 37 * i) % (len(NICS) - 1)] for i in range(n)]


def _ends(*, symbol_errors: int, aers: int, leaf_aers: int = 0) -> tuple[float, float]:
    """(P(NICS[0] reports on its cable), P(LEAVES[0] reports on one of its cables)) in one window after
    two hours of background: ``symbol_errors`` NICs log a symbol error on their cable and ``aers`` other
    NICs a corrected AER, evenly over the two hours, and ``leaf_aers`` of the other leaves a corrected AER."""
    s = Stream()
    span = 7200.0
    for i, nic in enumerate(_spread(symbol_errors, 0)):
        s.add(span * i / symbol_errors, E.LINK_ERROR, nic, link=next(iter(HGX.links_of(nic))))
    for i, nic in enumerate(_spread(aers, 300)):
        s.add(span * i / aers + 11, E.AER_CORRECTED, nic)
    for i, leaf in enumerate(LEAVES[1:1 + leaf_aers]):
        s.add(span * i / leaf_aers + 17, E.AER_CORRECTED, leaf)
    s.add(span + 60, E.ECC_SBE, sorted(HGX.of_kind(K.GPU))[0])  # an event after the last refresh
    engine = Engine(HGX)
    for ev in s.events:
        engine.observe(ev)
    coh = engine.coherence
    assert coh is not None
    assert not coh._explained  # background: no pattern left anyone out of the rates
    return coh._p_end(NICS[0]), coh._p_end(LEAVES[0])


def test_a_nics_aers_do_not_make_it_a_likelier_witness_of_its_cable() -> None:
    errors_only, _ = _ends(symbol_errors=60, aers=0)
    with_aers, _ = _ends(symbol_errors=60, aers=60)
    assert with_aers == errors_only  # the AERs named no link


def test_a_nics_symbol_errors_do() -> None:
    few, _ = _ends(symbol_errors=5, aers=60)
    many, _ = _ends(symbol_errors=60, aers=60)
    assert many > 2 * few


def test_a_leafs_reports_of_any_kind_still_count_over_its_links() -> None:
    _, quiet = _ends(symbol_errors=60, aers=0)
    _, with_aers = _ends(symbol_errors=60, aers=0, leaf_aers=10)
    assert with_aers > quiet
