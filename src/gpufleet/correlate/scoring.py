"""Score the engine on generated scenarios: top-1 / top-3 accuracy, healthy switches wrongly blamed,
false alarms on noise-only windows and lead time before a failure.

A suspect *blames* a component when the engine acts on it: a streamed verdict (NEW or CHANGED) with
an action other than ``observe``. A healthy switch is any NVSwitch chip, switch tray, leaf, spine or
core switch other than the ground truth (and, for a switch-tray fault, other than its own chips).
A scenario without a fault (``truth == ""``) counts every component blamed as a false alarm, and is
left out of top-1/top-3. The lead time is ``failure`` minus the first time the truth was blamed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction, VerdictStatus
from gpufleet.correlate.scenarios import SPAN, SWITCH_KINDS, T0, Scenario
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET
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
    false_alarms: int = 0  # components blamed in a scenario without a fault
    onset_to_verdict_s: float | None = None  # seconds from the fault's onset to the truth's first blame
    lead_s: float | None = None  # seconds from that blame to the hard failure (degrading scenarios)
    failed: bool = False  # the scenario ends in a hard failure
    warmup_blames: int = 0  # parts other than the truth blamed during a warm-up (before T0): a cold start's
    # The truth's closest approach to its coherence threshold over the stream: the largest log10(alpha / p)
    # its own pattern reached (> 0: significant at some event); None when it never had a scored pattern (or
    # no coherence). A unit (tray, node) can also be named through its parts' patterns, whatever its own.
    closest: float | None = None

    @property
    def faulty(self) -> bool:
        return bool(self.truth)


@dataclass(slots=True)
class Score:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def n(self) -> int:
        return sum(1 for o in self.outcomes if o.faulty)

    def top1(self) -> float:
        return sum(o.top1 for o in self.outcomes if o.faulty) / max(1, self.n)

    def top3(self) -> float:
        return sum(o.top3 for o in self.outcomes if o.faulty) / max(1, self.n)

    def noise_windows(self) -> int:
        return sum(1 for o in self.outcomes if not o.faulty)

    def false_alarms(self) -> int:
        return sum(o.false_alarms for o in self.outcomes)

    def warmup_blames(self) -> int:
        return sum(o.warmup_blames for o in self.outcomes)

    def leads(self) -> list[float | None]:
        """Lead time of each scenario that ends in a failure (None: not named before it failed)."""
        return [o.lead_s for o in self.outcomes if o.failed]

    def wrong_switch_scenarios(self) -> int:
        return sum(1 for o in self.outcomes if o.wrong_switches)

    def by(self, part: int) -> dict[str, tuple[int, float, float]]:
        """Per fault type (part=1), noise (2) or topology (0): (n, top1, top3)."""
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            if not o.faulty:
                continue
            groups.setdefault(o.scenario.split("/")[part], []).append(o)
        return {
            k: (len(v), sum(o.top1 for o in v) / len(v), sum(o.top3 for o in v) / len(v))
            for k, v in sorted(groups.items())
        }

    def misses(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.faulty and not o.top1]


def run_scenario(
    topology: Topology,
    sc: Scenario,
    *,
    catalog: Catalog | None = None,
    window: timedelta = timedelta(minutes=30),
    coherence: bool = True,
    budget: float = FALSE_ALARM_BUDGET,
) -> Outcome:
    engine = Engine(topology, window=window, catalog=catalog, coherence=coherence, false_alarm_budget=budget)
    healthy = _healthy_switches(topology, sc.truth)
    wrong: set[str] = set()
    streamed = 0
    first: int | None = None
    first_at = None
    after_onset = 0
    right = {sc.truth, *sc.accept} - {""}
    blamed: set[str] = set()
    standing: set[str] = set()  # blamed during a warm-up and neither cleared nor dropped to observe since
    warm_blamed: set[str] = set()
    coh = engine.coherence if sc.truth else None
    closest: float | None = None
    for ev in sc.events:
        if ev.time >= sc.onset:
            after_onset += 1
        verdicts = engine.observe(ev)
        if coh is not None:
            now = coh.scored_surprise(sc.truth)
            if now is not None and (closest is None or now > closest):
                closest = now
        for v in verdicts:
            streamed += 1
            s = v.suspect
            if v.status is VerdictStatus.CLEARED or s.action is SuspectAction.OBSERVE:
                standing.discard(s.component)
                continue
            if ev.time < T0:  # raised in a warm-up (weak suite, ``warmup``): counted apart, as warmup_blames
                standing.add(s.component)
                if s.component not in right:
                    warm_blamed.add(s.component)
                continue
            if s.component in standing:
                continue  # still standing from the warm-up (re-issued as it changes): a warm-up blame
            blamed.add(s.component)
            if s.component in healthy:
                wrong.add(s.component)
            if s.component in right and first is None:
                first, first_at = after_onset, v.time
    ranked = engine.suspects(T0 + SPAN)
    top = tuple(s.component for s in ranked[:3])
    lead = None
    if sc.failure is not None and first_at is not None and first_at <= sc.failure:
        lead = (sc.failure - first_at).total_seconds()
    return Outcome(
        sc.name,
        sc.truth,
        top,
        bool(top) and top[0] in right,
        bool(right & set(top)),
        tuple(sorted(wrong)),
        streamed,
        first,
        0 if right else len(blamed),
        None if first_at is None else (first_at - sc.onset).total_seconds(),
        lead,
        sc.failure is not None,
        len(warm_blamed),
        closest,
    )


def score(
    topology: Topology, scenarios: Iterable[Scenario], *, catalog: Catalog | None = None, coherence: bool = True,
    budget: float = FALSE_ALARM_BUDGET,
) -> Score:
    """``coherence=False`` scores the engine as it was before the coherence statistic (counts only);
    ``budget``: the statistic's false-alarm budget (false verdicts per node-day)."""
    out = Score()
    for sc in scenarios:
        out.outcomes.append(run_scenario(topology, sc, catalog=catalog, coherence=coherence, budget=budget))
    return out


def _healthy_switches(topo: Topology, truth: str) -> set[str]:
    spared = {truth, *topo.descendants(truth)} if truth in topo.components else {truth}
    if truth in topo.links:  # a cable's fault may be named by its slot; its ends are not "healthy"
        spared |= {topo.links[truth].a, topo.links[truth].b}
    return {c.id for c in topo.components.values() if c.kind.value in SWITCH_KINDS and c.id not in spared}


def closest(surprise: float | None) -> str:
    """A missed truth's closest approach (:attr:`Outcome.closest`) in words."""
    if surprise is None:
        return "never scored (never more than one witness on one symptom)"
    if surprise > 0:
        return f"significant at some event (log10 alpha/p {surprise:.2f}), not first at the end"
    return f"closest {-surprise:.2f} decades short of alpha"


def summary(sc: Score) -> dict[str, object]:
    kinds = Counter(o.scenario.split("/")[1] for o in sc.misses())
    out: dict[str, object] = {
        "scenarios": sc.n,
        "top1": round(sc.top1(), 4),
        "top3": round(sc.top3(), 4),
        "healthy_switch_blamed_scenarios": sc.wrong_switch_scenarios(),
        "misses_by_fault": dict(kinds),
        # per fault type, each miss's closest approach to its threshold, log10(alpha / p) (> 0: the truth
        # was significant at some event but not ranked first at the end; null: never scored)
        "miss_closest_by_fault": {
            k: sorted((None if o.closest is None else round(o.closest, 2) for o in sc.misses()
                       if o.scenario.split("/")[1] == k), key=lambda x: math.inf if x is None else -x)
            for k in sorted(kinds)
        },
        "warmup_blames": sc.warmup_blames(),  # before T0 (correlate-eval --warmup); 0 without one
    }
    if sc.noise_windows():
        out["noise_only_windows"] = sc.noise_windows()
        out["false_alarms"] = sc.false_alarms()
        out["false_alarms_per_window"] = round(sc.false_alarms() / sc.noise_windows(), 4)
    leads = sc.leads()
    if leads:
        got = sorted(x for x in leads if x is not None)
        out["degrading_named_before_failure"] = f"{len(got)}/{len(leads)}"
        out["lead_time_s_median"] = round(got[len(got) // 2], 1) if got else None
        out["lead_time_s_min"] = round(got[0], 1) if got else None
    delays = sorted(o.onset_to_verdict_s for o in sc.outcomes if o.top1 and o.onset_to_verdict_s is not None)
    if delays:
        out["onset_to_verdict_s_median"] = round(delays[len(delays) // 2], 1)
    return out
