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


def sparse_hgx() -> Topology:
    """Two HGX nodes where chip ``nvsw0`` of the first has one link to each GPU (the others keep theirs):
    eight GPUs with about 15 links each are about half a GPU's worth of exposure for that chip, less than
    one GPU reporting about itself. (A topology file that lists only some links reads like this.)"""
    full = generate_hgx(2)
    chip = next(c for c in full.components if c.endswith("-nvsw0"))
    kept, seen = [], set()
    for ln in full.links.values():
        if chip in (ln.a, ln.b):
            gpu = ln.other(chip)
            if gpu in seen:
                continue
            seen.add(gpu)
        kept.append(ln)
    return Topology.of(full.components.values(), kept)


def _keys(topo: Topology) -> list[tuple[str, str]]:
    """Every (reporter, link) a symptom can have: each component about itself, each link from either end,
    and from the unit of an end that is neither end (a node naming its GPU's link)."""
    keys = [(c, "") for c in topo.components]
    for lid, ln in topo.links.items():
        keys += [(ln.a, lid), (ln.b, lid)]
        unit = topo.unit_of(ln.a)
        if unit is not None and unit not in (ln.a, ln.b):
            keys.append((unit, lid))
    return keys


TOPOLOGIES = [generate_hgx(2), generate_nvl72(1), sparse_hgx()]
IDS = ["hgx", "nvl72", "sparse-hgx"]


def _plain(eng: Engine, reporter: str, link: str) -> tuple[tuple[str, ...], object]:
    cands = eng._candidates(reporter, link or None)
    sym = Symptom((reporter, link), cands, frozenset())
    return cands, eng._pairs(sym)


@pytest.mark.parametrize("topo", TOPOLOGIES, ids=IDS)
def test_place_equals_the_plain_candidates_and_pairs(topo: Topology) -> None:
    eng = Engine(topo)
    fresh = TopologyIndex(topo)  # nothing memoised: place() fills kinds and units itself
    keys = _keys(topo)
    assert len(keys) > 100
    for reporter, link in keys:
        assert fresh.place(reporter, link) == _plain(eng, reporter, link), (reporter, link)


@pytest.mark.parametrize("topo", TOPOLOGIES, ids=IDS)
def test_the_screens_bound_is_never_above_the_candidates_background(topo: Topology) -> None:
    """The coherence screens skip a candidate whose pattern is unsurprising even against the smallest
    background it can have, ``q[class] * share`` (the pair's fourth element). That is a bound only if
    ``share`` is at most the candidate's exposure to the reporter's class, ``E(c, class)``: ``mu(c)``
    sums ``E(c, r) * q[r]`` over the classes, whatever the rates. An HGX GPU naming its link to a chip of
    its own node was counted as inside the chip (share 1) although it is a far end (1/deg); on a chip with
    fewer GPU links than a GPU has links, 1 is more than all its GPUs' exposure together, and the screen
    could drop a pattern the statistic finds significant. A node naming its GPU's link is no end of it and
    has no exposure to the chip at the far end."""
    idx = TopologyIndex(topo)
    checked = 0
    for reporter, link in _keys(topo):
        rclass = idx.kind_of(reporter)
        for c, _, _, share in idx.place(reporter, link)[1]:
            exposure = idx.exposure.get(c) or idx.expose(c)
            assert share <= exposure.get(rclass, 0.0) + 1e-12, (reporter, link, c, share, exposure)
            checked += share > 0
    assert checked > 100


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
