"""What the correlator's false-alarm budget buys (decision 0112): the weak-signal suite's held-out split
scored at several budgets, with the noise-only windows that measure what each costs.

For each budget (false verdicts per node-day the coherence statistic may cost), topology (HGX, NVL72) and
noise level (realistic, heavy): top-1 / top-3 over every fault type (20 seeds each, ``--quick``: 5), top-1
per fault type, healthy switches blamed, and actionable verdicts on noise-only windows (400 per cell,
``--quick``: 40) against what the budget allows there (budget x nodes x the window's days), both cold (a
fresh engine, as the suite scores) and warm (30 minutes of background first, as a running controller has
seen; blames during the warm-up are not counted: decision 0110). Scenarios are generated once and scored
at every budget: the budgets are compared on the same streams.
"""

from __future__ import annotations

from datetime import timedelta

from gpufleet.correlate.scenarios import SPAN, Noise, TopologyKind
from gpufleet.correlate.scoring import score
from gpufleet.correlate.weak import WEAK_FAULTS, Split, WeakFault, generate_weak, weak_topology
from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET
from gpufleet.domain.fleet import ComponentKind

BUDGETS = (FALSE_ALARM_BUDGET, 3e-3, 1e-2, 3e-2, 1e-1)


def run(quick: bool) -> dict[str, object]:
    seeds, windows = (5, 40) if quick else (20, 400)
    out: dict[str, object] = {"split": Split.HELDOUT.value, "seeds_per_fault": seeds, "noise_only_windows": windows,
                              "budgets": list(BUDGETS), "cells": []}
    cells: list[dict[str, object]] = []
    for kind in TopologyKind:
        topo = weak_topology(kind)
        nodes = len(topo.of_kind(ComponentKind.NODE)) + len(topo.of_kind(ComponentKind.COMPUTE_TRAY))
        for noise in (Noise.REALISTIC, Noise.HEAVY):
            faults = [generate_weak(topo, kind, f, noise, s, Split.HELDOUT)
                      for f in WEAK_FAULTS[kind] if f is not WeakFault.NOISE_ONLY for s in range(seeds)]
            quiet = [generate_weak(topo, kind, WeakFault.NOISE_ONLY, noise, s, Split.HELDOUT) for s in range(windows)]
            warm = [generate_weak(topo, kind, WeakFault.NOISE_ONLY, noise, s, Split.HELDOUT, timedelta(minutes=30))
                    for s in range(windows)]
            for budget in BUDGETS:
                r = score(topo, faults, budget=budget)
                q = score(topo, quiet, budget=budget)
                qw = score(topo, warm, budget=budget)
                allowed = budget * nodes * windows * SPAN.total_seconds() / 86400
                cells.append({
                    "topology": kind.value, "noise": noise.value, "budget": budget,
                    "top1": round(r.top1(), 3), "top3": round(r.top3(), 3),
                    "healthy_switch_blamed_scenarios": r.wrong_switch_scenarios() + q.wrong_switch_scenarios(),
                    "false_alarms": q.false_alarms(), "false_alarms_warm": qw.false_alarms(),
                    "false_alarms_allowed": round(allowed, 2),
                    "by_fault": {f: round(t1, 2) for f, (_, t1, _) in r.by(1).items()},
                })
                print(f"{kind.value:5} {noise.value:9} budget {budget:g}: top-1 {r.top1():.3f}, "
                      f"false alarms {q.false_alarms()} cold, {qw.false_alarms()} warm in {windows} windows "
                      f"(budget allows {allowed:.1f})",
                      flush=True)
    out["cells"] = cells
    return out
