"""Score the engine on generated scenarios: top-1 / top-3 accuracy and healthy switches wrongly blamed.

A suspect *blames* a component when the engine acts on it: a streamed verdict (NEW or CHANGED) with
an action other than ``observe``. A healthy switch is any NVSwitch chip, switch tray, leaf, spine or
core switch other than the ground truth (and, for a switch-tray fault, other than its own chips).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction, VerdictStatus
from gpufleet.correlate.scenarios import SPAN, SWITCH_KINDS, T0, Scenario
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.topology import Topology


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    truth: str
    top: tuple[str, ...]  # the first three suspects' components
    top1: bool
    top3: bool
    wrong_switches: tuple[str, ...]  # healthy switches blamed by a streamed verdict
    verdicts: int  # streamed verdict changes (new + changed + cleared)
    events_to_verdict: int | None  # events after onset until the truth was first blamed


@dataclass(slots=True)
class Score:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.outcomes)

    def top1(self) -> float:
        return sum(o.top1 for o in self.outcomes) / max(1, self.n)

    def top3(self) -> float:
        return sum(o.top3 for o in self.outcomes) / max(1, self.n)

    def wrong_switch_scenarios(self) -> int:
        return sum(1 for o in self.outcomes if o.wrong_switches)

    def by(self, part: int) -> dict[str, tuple[int, float, float]]:
        """Per fault type (part=1), noise (2) or topology (0): (n, top1, top3)."""
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            groups.setdefault(o.scenario.split("/")[part], []).append(o)
        return {
            k: (len(v), sum(o.top1 for o in v) / len(v), sum(o.top3 for o in v) / len(v))
            for k, v in sorted(groups.items())
        }

    def misses(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.top1]


def run_scenario(
    topology: Topology,
    sc: Scenario,
    *,
    catalog: Catalog | None = None,
    window: timedelta = timedelta(minutes=30),
) -> Outcome:
    engine = Engine(topology, window=window, catalog=catalog)
    healthy = _healthy_switches(topology, sc.truth)
    wrong: set[str] = set()
    streamed = 0
    first: int | None = None
    after_onset = 0
    for ev in sc.events:
        if ev.time >= sc.onset:
            after_onset += 1
        for v in engine.observe(ev):
            streamed += 1
            s = v.suspect
            if v.status is VerdictStatus.CLEARED or s.action is SuspectAction.OBSERVE:
                continue
            if s.component in healthy:
                wrong.add(s.component)
            if s.component == sc.truth and first is None:
                first = after_onset
    ranked = engine.suspects(T0 + SPAN)
    top = tuple(s.component for s in ranked[:3])
    return Outcome(
        sc.name,
        sc.truth,
        top,
        bool(top) and top[0] == sc.truth,
        sc.truth in top,
        tuple(sorted(wrong)),
        streamed,
        first,
    )


def score(topology: Topology, scenarios: Iterable[Scenario], *, catalog: Catalog | None = None) -> Score:
    out = Score()
    for sc in scenarios:
        out.outcomes.append(run_scenario(topology, sc, catalog=catalog))
    return out


def _healthy_switches(topo: Topology, truth: str) -> set[str]:
    spared = {truth, *topo.descendants(truth)} if truth in topo.components else {truth}
    return {c.id for c in topo.components.values() if c.kind.value in SWITCH_KINDS and c.id not in spared}


def summary(sc: Score) -> dict[str, object]:
    kinds = Counter(o.scenario.split("/")[1] for o in sc.misses())
    return {
        "scenarios": sc.n,
        "top1": round(sc.top1(), 4),
        "top3": round(sc.top3(), 4),
        "healthy_switch_blamed_scenarios": sc.wrong_switch_scenarios(),
        "misses_by_fault": dict(kinds),
    }
