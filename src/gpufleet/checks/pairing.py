"""Multi-node localisation: which node (or link) makes a collective slow. Pure: no torch.

Google's cluster-health-scanner runs NCCL in two passes; we do the same:

1. **First pass.** Pair the nodes (0-1, 2-3, ...; an odd last node is paired with node 0 in a second
   round; three nodes are measured in all three pairs) and measure every pair's all-reduce bus
   bandwidth, the pairs of a round at the same time. A pair fails when it is below
   ``bar = max(floor, (1 - tolerance) * best first-pass pair)``. The best pair, not the median, is the
   reference (gpu-fryer's rule within a node, applied to pairs): a link cannot run faster than it is
   built for, so the best pair is a healthy one, while a slow node sits in up to two first-pass pairs
   and could drag a median down with it.
2. **Second pass.** Both nodes of a failed pair are only *suspects*: each is re-paired with a node
   from a passing pair (known good) and measured again. A suspect that fails again with a good
   partner is blamed; one that now passes is cleared. A failed pair whose two nodes are both cleared
   points at the path between them (a link), which is reported instead.
   Without any known-good node (every first-pass pair failed), up to ``bootstrap_rounds`` rounds of
   not-yet-measured pairs among the suspects look for one; if none is found (two nodes, or every
   node slow) the suspects stay *inconclusive*.

**Known-good nodes** (``known_good``, e.g. the in-service partners a validation job pairs a repaired
node with) are good from the start: never suspects, never blamed, always available as partners. So
a node paired with one known-good node is blamed when their pair fails; with a single pair the bar
is the SKU's floor (a pair is its own best pair), with two or more partners also the best pair.

``measure`` is injected: the torch side runs real all-reduces; tests pass a function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet.domain.errors import InvalidInput

Pair = tuple[str, str]
Measure = Callable[[Sequence[Pair]], Mapping[Pair, float]]


@dataclass(frozen=True, slots=True)
class PairResult:
    a: str
    b: str
    busbw: float
    ok: bool
    stage: str  # "first", "bootstrap" or "second"


@dataclass(frozen=True, slots=True)
class Localisation:
    reference: float | None  # the best first-pass pair's busbw
    bar: float  # what a pair had to reach
    pairs: tuple[PairResult, ...]
    good: tuple[str, ...]
    blamed: tuple[str, ...]  # slow with a known-good partner
    cleared: tuple[str, ...]  # suspected in the first pass, fine with a known-good partner
    inconclusive: tuple[str, ...]  # suspected, but no known-good node to test against
    blamed_links: tuple[Pair, ...]  # failed pairs whose two nodes were both cleared

    @property
    def ok(self) -> bool:
        return not (self.blamed or self.inconclusive or self.blamed_links)


def first_pass_rounds(nodes: Sequence[str]) -> list[list[Pair]]:
    """Disjoint pairs covering every node; an odd last node joins node 0 in a second round (three
    nodes: all three pairs, or a slow node 0 would be in every pair)."""
    if len(nodes) < 2:
        raise InvalidInput("nodes", list(nodes), "at least 2 nodes to pair")
    if len(set(nodes)) != len(nodes):
        raise InvalidInput("nodes", list(nodes), "distinct node names")
    if len(nodes) == 3:
        a, b, c = nodes
        return [[(a, b)], [(c, a)], [(b, c)]]
    rounds = [[(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]]
    if len(nodes) % 2:
        rounds.append([(nodes[-1], nodes[0])])
    return rounds


def second_pass_rounds(suspects: Sequence[str], good: Sequence[str]) -> list[list[Pair]]:
    """Each suspect with a known-good partner; no node twice in a round (so a round runs at once)."""
    if not good:
        return []
    rounds: list[list[Pair]] = []
    pending = list(suspects)
    while pending:
        batch = pending[: len(good)]
        pending = pending[len(good) :]
        rounds.append([(s, good[i]) for i, s in enumerate(batch)])
    return rounds


def bootstrap_round(suspects: Sequence[str], tested: set[frozenset[str]]) -> list[Pair]:
    """Disjoint pairs of suspects not measured together yet (greedy, in node order)."""
    used: set[str] = set()
    out: list[Pair] = []
    for i, a in enumerate(suspects):
        if a in used:
            continue
        for b in suspects[i + 1 :]:
            if b not in used and frozenset((a, b)) not in tested:
                out.append((a, b))
                used.update((a, b))
                break
    return out


def _run(rounds: list[list[Pair]], measure: Measure) -> dict[Pair, float]:
    out: dict[Pair, float] = {}
    for pairs in rounds:
        got = measure(pairs)
        for pair in pairs:
            if pair not in got:
                raise InvalidInput("measure", sorted(got), f"a bandwidth for every pair, {pair} missing")
            out[pair] = float(got[pair])
    return out


def localise(
    nodes: Sequence[str],
    measure: Measure,
    *,
    floor: float = 0.0,
    tolerance: float = 0.25,
    bootstrap_rounds: int = 2,
    known_good: Sequence[str] = (),
) -> Localisation:
    """Run both passes through ``measure`` and say which nodes or links are slow."""
    if not 0 <= tolerance < 1:
        raise InvalidInput("tolerance", tolerance, "a fraction in [0, 1)")
    unknown = sorted(set(known_good) - set(nodes))
    if unknown:
        raise InvalidInput("known_good", unknown, f"nodes of the allocation {list(nodes)}")
    if floor < 0:
        raise InvalidInput("floor", floor, "a non-negative bandwidth")
    first = _run(first_pass_rounds(nodes), measure)
    reference = max(first.values())
    bar = max(floor, (1.0 - tolerance) * reference)
    results = [PairResult(a, b, bw, bw >= bar, "first") for (a, b), bw in first.items()]
    good = [n for n in nodes if n in known_good or any(r.ok and n in (r.a, r.b) for r in results)]
    tested = {frozenset(p) for p in first}
    for _ in range(bootstrap_rounds):
        if good:
            break
        pairs = bootstrap_round([n for n in nodes if n not in good], tested)
        if not pairs:
            break
        extra = _run([pairs], measure)
        tested |= {frozenset(p) for p in extra}
        results += [PairResult(a, b, bw, bw >= bar, "bootstrap") for (a, b), bw in extra.items()]
        good = [n for n in nodes if n in known_good or any(r.ok and n in (r.a, r.b) for r in results)]
    suspects = [n for n in nodes if n not in good]
    second = _run(second_pass_rounds(suspects, good), measure)
    results += [PairResult(a, b, bw, bw >= bar, "second") for (a, b), bw in second.items()]
    blamed = [s for (s, _g), bw in second.items() if bw < bar]
    cleared = [s for (s, _g), bw in second.items() if bw >= bar]
    inconclusive = [] if good else suspects
    links = [
        (r.a, r.b) for r in results if r.stage != "second" and not r.ok and r.a in cleared and r.b in cleared
    ]
    return Localisation(
        reference=reference,
        bar=bar,
        pairs=tuple(results),
        good=tuple(good),
        blamed=tuple(blamed),
        cleared=tuple(cleared),
        inconclusive=tuple(inconclusive),
        blamed_links=tuple(links),
    )
