"""What the correlation engine looks up about its topology per event, memoised once per topology.

Every fact here is a pure function of the topology (a component's kind, its unit, how many links it
has, a candidate's exposure, the size of each class), computed on first use and shared by every
engine and coherence statistic on the same :class:`~gpufleet.domain.topology.Topology` object: the
benchmark and the evaluation run a fresh engine per scenario, and a long-lived engine meets the same
components again. The per-event code reads the plain dictionaries (a method call costs more than the
lookup it wraps); the methods fill them.
"""

from __future__ import annotations

from gpufleet.correlate.explain import UNITS as _UNIT_KINDS  # what contains other candidates
from gpufleet.correlate.model import SymptomKey
from gpufleet.domain.topology import Topology

_EXPOSURE_CACHE = 200_000  # candidates whose exposure is kept
_PLACEMENT_CACHE = 50_000  # (reporter, link) placements kept (about 0.6 kB each); all dropped when full
# (candidate, witness, class, the reporter's own exposure to the candidate) per candidate: see own_share
Pairs = tuple[tuple[str, str, str, float], ...]
_KEEP = 4  # topologies whose index is kept


class TopologyIndex:
    """Memoised per-topology facts; get one with :func:`index_of`."""

    __slots__ = ("_class_size", "_link_classes", "_rest", "degree", "exposure", "hits", "kinds", "placements",
                 "topology", "units")

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.kinds: dict[str, str] = {}  # component id -> kind; any other id -> "link"
        self.units: dict[str, str | None] = {}  # component id -> its unit (Topology.unit_of)
        self.degree: dict[str, int] = {}  # component id -> its links, at least 1
        # candidate -> class -> reporters of that class that can name it (coherence.py's exposure)
        self.exposure: dict[str, dict[str, float]] = {}
        # (reporter, link or "") -> its candidates and their coherence pairs (engine.py's _place, _pairs)
        self.placements: dict[SymptomKey, tuple[tuple[str, ...], Pairs]] = {}
        self.hits = 0  # placements found in the memo since it was last emptied (engine.py counts them)
        self._rest = 0  # placements still not to keep: the last fill of the memo was seldom hit
        self._class_size: dict[str, int] | None = None
        self._link_classes: frozenset[str] = frozenset()

    def kind_of(self, ident: str) -> str:
        k = self.kinds.get(ident)
        if k is None:
            comp = self.topology.components.get(ident)
            k = self.kinds[ident] = comp.kind.value if comp is not None else "link"
        return k

    def unit_of(self, ident: str) -> str | None:
        units = self.units
        if ident in units:
            return units[ident]
        u = units[ident] = self.topology.unit_of(ident)
        return u

    def deg(self, ident: str) -> int:
        d = self.degree.get(ident)
        if d is None:
            d = self.degree[ident] = max(1, len(self.topology.links_of(ident)))
        return d

    def place(self, reporter: str, link: str) -> tuple[tuple[str, ...], Pairs]:
        """A symptom's candidates and coherence pairs (``engine._candidates`` and ``engine._pairs``,
        the plain definitions the tests compare this with) in one pass: with coherence on every new
        (reporter, link) is placed, and at 131,072 GPUs most are new (about one event in two)."""
        kinds, units = self.kinds, self.units
        kind_of, unit_of = self.kind_of, self.unit_of
        out: list[str]
        ends: tuple[str, ...]
        if link:
            ln = self.topology.links[link]
            a, b = ln.a, ln.b
            ends = (a, b) if reporter in (a, b) else (reporter, a, b)
            out = [link]
        else:
            a = b = ""
            ends = (reporter,)
            out = []
        for e in ends:
            if e not in out:
                out.append(e)
            u = units[e] if e in units else unit_of(e)
            if u is not None and u not in out:
                out.append(u)
        runit = units[reporter]
        # The reporter's own exposure to a candidate (own_share): 1 inside it, 1/deg as an end of the link.
        end_share = 1.0 / (self.degree.get(reporter) or self.deg(reporter)) if reporter in (a, b) else 0.0
        cands: list[str] = []
        pairs: list[tuple[str, str, str, float]] = []
        for c in out:
            kind = kinds.get(c) or kind_of(c)
            if kind == "rack":
                continue
            cands.append(c)
            if kind == "link":
                pairs.append((c, reporter, ln.kind, end_share))
            elif c == reporter:
                pairs.append((c, "self", kind, 1.0))
            elif kind in _UNIT_KINDS:
                w = reporter if runit == c or not link else a if unit_of(a) == c else b if unit_of(b) == c else reporter
                pairs.append((c, w, kind, 1.0 if runit == c else end_share))
            elif not link:
                pairs.append((c, reporter, kind, 1.0))
            elif c in (a, b):
                far = b if c == a else a
                fu = unit_of(far)
                w = fu if fu is not None and fu != unit_of(c) else far
                pairs.append((c, w, kind, end_share))  # the reporter is the far end, never inside c
            else:
                pairs.append((c, link, kind, end_share))
        return tuple(cands), tuple(pairs)

    def expose(self, c: str) -> dict[str, float]:
        """Candidate ``c``'s exposure per reporter class (kept): the reporters that can name it, a
        reporter inside ``c`` (or ``c`` itself) counting 1 and the far end of a link to it 1/deg (the
        coherence statistic's ``E(c, r)``)."""
        topo = self.topology
        out: dict[str, float] = {}

        def far(r: str) -> None:
            cls = self.kind_of(r)
            out[cls] = out.get(cls, 0.0) + 1.0 / self.deg(r)

        if c in topo.links:
            ln = topo.links[c]
            far(ln.a)
            far(ln.b)
        else:
            inside = {c, *topo.descendants(c)}
            for m in inside:
                cls = self.kind_of(m)
                out[cls] = out.get(cls, 0.0) + 1.0
                for lid in topo.links_of(m):
                    other = topo.links[lid].other(m)
                    if other not in inside:
                        far(other)
        self.exposure[c] = out
        if len(self.exposure) > _EXPOSURE_CACHE:
            self.exposure.pop(next(iter(self.exposure)))
        return out

    def keep_placement(self, key: SymptomKey, cands: tuple[str, ...], pairs: Pairs) -> None:
        """Keep a placement. When the memo is full it is emptied (cheaper than evicting one by one);
        if that fill was hit less than once per 8 entries (131,072 GPUs: most (reporter, link) are
        new), placements are not kept for the next 4 fills' worth: keeping them cost more than they
        saved (2026-11-27: 6-7 % of the engine's time with coherence, docs/benchmarks.md)."""
        if self._rest:
            self._rest -= 1
            return
        if len(self.placements) >= _PLACEMENT_CACHE:
            if self.hits * 8 < _PLACEMENT_CACHE:
                self._rest = 4 * _PLACEMENT_CACHE
            self.placements.clear()
            self.hits = 0
            if self._rest:
                return
        self.placements[key] = (cands, pairs)

    @property
    def class_size(self) -> dict[str, int]:
        """Components per kind and links per link kind (computed on first use: a walk of the topology)."""
        if self._class_size is None:
            counts: dict[str, int] = {}
            for comp in self.topology.components.values():
                k = comp.kind.value
                counts[k] = counts.get(k, 0) + 1
            links: dict[str, int] = {}
            for ln in self.topology.links.values():
                links[ln.kind] = links.get(ln.kind, 0) + 1
            for k, n in links.items():
                counts[k] = counts.get(k, 0) + n
            self._link_classes = frozenset(links)
            self._class_size = counts
        return self._class_size

    @property
    def link_classes(self) -> frozenset[str]:
        """The link kinds (a cable candidate's class is its link's kind)."""
        _ = self.class_size
        return self._link_classes


_SHARED: dict[int, TopologyIndex] = {}


def index_of(topology: Topology) -> TopologyIndex:
    """The shared index of ``topology`` (the same object for every caller while it is kept)."""
    idx = _SHARED.get(id(topology))
    if idx is None or idx.topology is not topology:
        if len(_SHARED) >= _KEEP:
            _SHARED.pop(next(iter(_SHARED)))
        idx = _SHARED[id(topology)] = TopologyIndex(topology)
    return idx
