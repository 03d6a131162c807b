"""The one-pass placement (:meth:`TopologyIndex.place`) equals the engine's plain definitions.

With coherence on every new (reporter, link) is placed; ``TopologyIndex.place`` computes the
candidates and coherence pairs in one pass. It must give exactly what ``Engine._candidates`` and
``Engine._pairs`` give, for every link seen from either end (and from a reporter that is neither
end), and for every component reporting about itself.
"""

from __future__ import annotations

import pytest

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.index import TopologyIndex
from gpufleet.correlate.symptoms import Symptom
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72


def _plain(eng: Engine, reporter: str, link: str) -> tuple[tuple[str, ...], object]:
    cands = eng._candidates(reporter, link or None)
    sym = Symptom((reporter, link), cands, frozenset())
    return cands, eng._pairs(sym)


@pytest.mark.parametrize("topo", [generate_hgx(2), generate_nvl72(1)], ids=["hgx", "nvl72"])
def test_place_equals_the_plain_candidates_and_pairs(topo: Topology) -> None:
    eng = Engine(topo)
    fresh = TopologyIndex(topo)  # nothing memoised: place() fills kinds and units itself
    keys = [(c, "") for c in topo.components]
    for lid, ln in topo.links.items():
        keys += [(ln.a, lid), (ln.b, lid)]
        unit = topo.unit_of(ln.a)
        if unit is not None and unit not in (ln.a, ln.b):
            keys.append((unit, lid))  # a reporter that is neither end (a node naming its GPU's link)
    assert len(keys) > 100
    for reporter, link in keys:
        assert fresh.place(reporter, link) == _plain(eng, reporter, link), (reporter, link)


def test_a_memo_fill_seldom_hit_rests_then_fills_again() -> None:
    from gpufleet.correlate import index

    topo = generate_nvl72(1)
    idx = TopologyIndex(topo)
    cap = index._PLACEMENT_CACHE
    for i in range(cap):
        idx.keep_placement((f"r{i}", ""), (), ())
    assert len(idx.placements) == cap
    idx.keep_placement(("full", ""), (), ())  # full, never hit: emptied and not kept for a while
    assert idx.placements == {}
    for i in range(4 * cap):
        idx.keep_placement((f"s{i}", ""), (), ())
    assert idx.placements == {}
    idx.keep_placement(("again", ""), (), ())
    assert list(idx.placements) == [("again", "")]
    for i in range(cap - 1):
        idx.keep_placement((f"t{i}", ""), (), ())
    idx.hits = cap // 8  # a fill hit this often is kept on
    idx.keep_placement(("kept", ""), (), ())
    assert list(idx.placements) == [("kept", "")]
