"""The coherence screens are shortcuts: an engine whose screens test every pattern against a background of
0 (so none is ever dropped, every one is scored in full) streams the same verdicts (decision 0120).

The screens drop a pattern that is unsurprising even against ``q * share``, the smallest background the
reporter allows; the pairs' ``share`` is that bound's part of the candidate's exposure. A share of 0 is
the trivially valid bound. Before decision 0120 an HGX chip reporting on its port to a GPU counted as
inside the GPU: on heavy-noise stream tune seed 20 the screen dropped a GPU whose own errors and two chips'
SXIDs the full score finds significant, so the screened engine stayed silent where the unscreened one
named the GPU.
"""

from __future__ import annotations

import pytest

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.index import Pairs, TopologyIndex
from gpufleet.correlate.scenarios import Noise, TopologyKind
from gpufleet.correlate.weak import Split, WeakFault, generate_weak
from gpufleet.domain.eventio import FileEvent
from gpufleet.domain.topology import Topology
from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72

# (kind, fault, noise, seed): tune seed 20 is where the old screen hid a verdict; the rest are patterns
# of each shape the screens see (chips and GPUs, trays, cables, leaves) in both noises.
STREAMS = [
    (TopologyKind.HGX, WeakFault.NOISE_ONLY, Noise.HEAVY, 20),
    (TopologyKind.HGX, WeakFault.NOISE_ONLY, Noise.HEAVY, 21),
    (TopologyKind.HGX, WeakFault.NOISE_ONLY, Noise.HEAVY, 22),
    (TopologyKind.HGX, WeakFault.GPU_PORT, Noise.HEAVY, 2),
    (TopologyKind.HGX, WeakFault.NVSWITCH, Noise.REALISTIC, 3),
    (TopologyKind.HGX, WeakFault.IB_CABLE, Noise.HEAVY, 4),
    (TopologyKind.HGX, WeakFault.LEAF, Noise.REALISTIC, 5),
    (TopologyKind.NVL72, WeakFault.COMPUTE_TRAY, Noise.HEAVY, 6),
    (TopologyKind.NVL72, WeakFault.NOISE_ONLY, Noise.HEAVY, 7),
    (TopologyKind.NVL72, WeakFault.NVSWITCH, Noise.REALISTIC, 8),
]


def _topology(kind: TopologyKind) -> Topology:
    """A topology object of its own: the per-topology index (and its placements) is not shared with the
    other tests, so the unscreened placements below stay here."""
    return generate_hgx(64) if kind is TopologyKind.HGX else generate_nvl72(4)


def _verdicts(topo: Topology, events: list[FileEvent]) -> list[tuple[str, str, str, float, str]]:
    eng = Engine(topo, coherence=True)
    out = []
    for ev in events:
        for v in eng.observe(ev):
            s = v.suspect
            out.append((v.status.value, s.component, s.action.value, round(s.confidence, 9), v.time.isoformat()))
    return out


@pytest.mark.parametrize(("kind", "fault", "noise", "seed"), STREAMS,
                         ids=[f"{k}-{f}-{n}-{s}" for k, f, n, s in STREAMS])
def test_an_engine_without_screens_streams_the_same_verdicts(
    kind: TopologyKind, fault: WeakFault, noise: Noise, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    screened_topo, unscreened_topo = _topology(kind), _topology(kind)
    events = list(generate_weak(screened_topo, kind, fault, noise, seed, Split.TUNE).events)
    screened = _verdicts(screened_topo, events)

    place = TopologyIndex.place

    def unscreened(self: TopologyIndex, reporter: str, link: str) -> tuple[tuple[str, ...], Pairs]:
        cands, pairs = place(self, reporter, link)
        if self.topology is unscreened_topo:
            pairs = tuple((c, w, cls, 0.0) for c, w, cls, _ in pairs)
        return cands, pairs

    monkeypatch.setattr(TopologyIndex, "place", unscreened)
    assert _verdicts(unscreened_topo, events) == screened
    if (kind, fault, seed) == (TopologyKind.HGX, WeakFault.NOISE_ONLY, 20):
        assert screened, "the stream where the old screen hid a verdict has one"
