"""Explaining a set of symptoms by the components they share: greedy weighted set cover with an
Occam cost per hypothesis, minimum-witness rules, and a confidence from evidence and margin.

A *symptom* is (reporter, link): "component X reported trouble on link L" (or on itself). Each symptom
can be explained by a few *candidates*: the link, its two ends, and the replaceable units (node,
compute tray, switch tray) those ends sit in. A candidate is only eligible when its symptoms come from
enough distinct *witnesses*:

* a switch (NVSwitch chip, leaf, spine, core) needs 3 distinct far ends (GPUs, NICs, leaves), or 2
  when all of them are switches (a spine with two leaves), unless it reports a degraded/fatal error
  about itself — so two unlucky host cables never frame a healthy leaf;
* a node / compute tray / switch tray needs 2 distinct components inside it with symptoms;
* a link, GPU or NIC needs 1.

The greedy pass repeatedly takes the eligible candidate with the highest ``sum(weight) - cost`` over
the symptoms not yet explained, where a symptom weighs half for a GPU or NIC at the far end of the
reported link (so errors at both ends of one cable point at the cable). Costs make a smaller, more
specific explanation win a tie (a GPU over its tray, an NVSwitch chip over its switch tray); a larger
unit only wins when it explains strictly more (the symptoms span several of its parts). NVSwitch and
leaf witnesses are counted per distinct far *unit* (tray, node) when the far end sits in another unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

# Occam costs, in units of one fatal symptom. Links first: cables fail far more often than ports.
COST: dict[str, float] = {
    "link": 0.0,
    "gpu": 0.1,
    "nic": 0.1,
    "nvswitch": 0.2,
    "leaf_switch": 0.3,
    "spine_switch": 0.3,
    "core_switch": 0.3,
    "node": 1.2,
    "compute_tray": 1.2,
    "switch_tray": 1.5,
}
MIN_WITNESSES: dict[str, int] = {
    "nvswitch": 3,
    "leaf_switch": 3,
    "spine_switch": 3,
    "core_switch": 3,
    "node": 2,
    "compute_tray": 2,
    "switch_tray": 2,
}
_SHIFT = max(COST.values())
SWITCHES = frozenset({"nvswitch", "leaf_switch", "spine_switch", "core_switch"})
UNITS = frozenset({"node", "compute_tray", "switch_tray"})
SEVERITY_WEIGHT = (0.5, 0.8, 1.0)  # info (rate-activated), degraded, fatal
# A report about a link counts half for the device (GPU, NIC) at the far end: "the other end may be the
# source" is weaker than a local error, so errors at both ends of one cable point at the cable, not at
# either device. Switches and units count it fully (their minimum-witness rules guard them instead).
REMOTE_FACTOR = 0.5


def weight(c: str, s: SymptomLike) -> float:
    return s.strength() if c in s.local else REMOTE_FACTOR * s.strength()


class SymptomLike(Protocol):
    """The view of a symptom the explainer needs (implemented by the engine's symptom record).

    ``selfsev`` is the severity index (0 info, 1 degraded, 2 fatal) of the worst in-window event the
    reporter raised about itself with no link; ``strength()`` the weight of the symptom now.
    """

    @property
    def reporter(self) -> str: ...
    @property
    def link(self) -> str: ...
    @property
    def cands(self) -> tuple[str, ...]: ...
    @property
    def selfsev(self) -> int: ...
    @property
    def local(self) -> frozenset[str]: ...
    def strength(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Explanation:
    candidate: str
    kind: str
    symptoms: frozenset[SymptomLike]
    evidence_weight: float
    score: float
    confidence: float
    alternatives: tuple[tuple[str, float], ...]  # (candidate, confidence), best first


Witness = Callable[[str, str, SymptomLike], str]


def explain(
    symptoms: Collection[SymptomLike],
    cover: Callable[[str], Iterable[SymptomLike]],
    kind_of: Callable[[str], str],
    witness: Witness,
    alternatives: int = 2,
    significant: Callable[[str], bool] | None = None,
) -> list[Explanation]:
    """Greedy explanation of ``symptoms``; ``cover(c)`` yields the active symptoms candidate c explains.

    ``significant(c)``: the coherence statistic found ``c``'s pattern of witnesses unlikely under the
    background (its own test, at the false-alarm budget). Such a candidate's Occam cost is lowered by
    the largest cost, so it is cheaper than any candidate that is not (the data already paid for the
    larger hypothesis: a tray whose weak pattern followed it across a swap is not out-bid by one of its
    GPUs), while among significant candidates the usual order stands (an HGX chip over its node)."""
    remaining = set(symptoms)
    cands: set[str] = {c for s in remaining for c in s.cands}
    covers = {c: [s for s in cover(c) if s in remaining] for c in cands}
    kinds = {c: kind_of(c) for c in cands}
    cost = {c: COST.get(kinds[c], 1.0) - (_SHIFT if significant is not None and significant(c) else 0.0)
            for c in cands}
    out: list[Explanation] = []
    while remaining:
        best: tuple[float, float, str] | None = None
        for c in cands:
            mine = [s for s in covers[c] if s in remaining]
            if not mine or not _eligible(c, kinds[c], mine, witness, kind_of):
                continue
            # Rounded: the last bits must not break a tie that the Occam cost and the name are there to
            # break (the same stream, the same verdict). fsum: exact whatever the order of the terms.
            score = round(math.fsum(weight(c, s) for s in mine) - cost[c], 9)
            key = (score, -cost[c], c)
            if best is None or key > best:
                best = key
        if best is None:
            break
        c = best[2]
        mine_set = frozenset(s for s in covers[c] if s in remaining)
        out.append(_confidence(c, kinds, mine_set, best[0], covers, alternatives, witness, kind_of, cost))
        remaining -= mine_set
        cands.discard(c)
    return out


def _eligible(c: str, kind: str, mine: list[SymptomLike], witness: Witness, kind_of: Callable[[str], str]) -> bool:
    need = MIN_WITNESSES.get(kind, 1)
    if need <= 1:
        return True
    if kind in SWITCHES or kind in UNITS:
        for s in mine:
            if s.reporter == c and not s.link and s.selfsev >= 1:
                return True  # it says so itself (fatal/degraded SXID, heartbeat lost, thermal)
    seen: set[str] = set()
    for s in mine:
        seen.add(witness(c, kind, s))
        if len(seen) >= need:
            return True
    # A spine or core switch only has switches below it: two of them agreeing is enough.
    return kind in SWITCHES and len(seen) >= 2 and all(kind_of(w) in SWITCHES for w in seen if w != "self")


def _confidence(
    c: str,
    kinds: dict[str, str],
    mine: frozenset[SymptomLike],
    score: float,
    covers: dict[str, list[SymptomLike]],
    alternatives: int,
    witness: Witness,
    kind_of: Callable[[str], str],
    cost: dict[str, float],
) -> Explanation:
    total = math.fsum(weight(c, s) for s in mine)  # a set of symptoms: no fixed order, an exact sum
    strength = 1.0 - math.exp(-total)
    rivals: list[tuple[float, str]] = []
    for other in {o for s in mine for o in s.cands if o != c}:
        theirs = covers.get(other, [])
        if not theirs or not _eligible(other, kinds[other], theirs, witness, kind_of):
            continue  # e.g. a leaf with one reporting port cannot explain anything
        overlap = [s for s in theirs if s in mine]
        rivals.append((round(math.fsum(weight(other, s) for s in overlap)
                             - cost.get(other, COST.get(kinds.get(other, ""), 1.0)), 9), other))
    rivals.sort(key=lambda r: (-r[0], r[1]))
    runner_up = rivals[0][0] if rivals else score - 1.5
    confidence = min(0.99, strength * _sigmoid(3.0 * (score - runner_up)))
    alts = tuple(
        (other, round(min(confidence, strength * _sigmoid(3.0 * (s_other - score))), 4))
        for s_other, other in rivals[:alternatives]
    )
    return Explanation(c, kinds[c], mine, total, score, confidence, alts)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))
