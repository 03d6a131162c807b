"""What the correlator's watch list shows (``Engine.watching``; docs/correlate.md §Watch list): how many of
the weak-signal suite's faults that get no verdict were at least watched, and how often noise alone puts
something on the list.

Held-out split, realistic and heavy noise, 20 seeds per fault type (``--quick``: 5). Each scenario is
streamed through a fresh engine; once a minute of stream time the watch list is read. A scenario is
*named* when a verdict names the truth (or an id the scenario accepts) at any time, *watched only* when
it never is but the truth is on the watch list at some minute, else *neither*. Noise-only streams (30
minutes, scored after 30 minutes of background as a running controller has seen it; 20 per cell,
``--quick``: 5) give the share of minutes with an empty watch list and the largest list.
"""

from __future__ import annotations

from datetime import timedelta

from gpufleet.correlate.engine import Engine
from gpufleet.correlate.scenarios import Noise, Scenario, TopologyKind
from gpufleet.correlate.weak import WEAK_FAULTS, Split, WeakFault, generate_weak, weak_topology
from gpufleet.domain.topology import Topology

MINUTE = timedelta(minutes=1)


def _stream(topo: Topology, sc: Scenario) -> tuple[bool, bool, list[int]]:
    """(the truth named by a verdict, the truth watched at some minute, the watch list's size each minute)."""
    ok = {sc.truth, *sc.accept} - {""}
    eng = Engine(topo, coherence=True)
    named = watched = False
    sizes: list[int] = []
    nxt = None
    for ev in sc.events:
        named |= any(v.suspect.component in ok for v in eng.observe(ev))
        nxt = nxt or ev.time + MINUTE
        while ev.time >= nxt:
            rows = eng.watching(nxt)
            sizes.append(len(rows))
            watched |= any(r.component in ok for r in rows)
            nxt += MINUTE
    return named, watched, sizes


def run(quick: bool) -> dict[str, object]:
    seeds = 5 if quick else 20
    cells: list[dict[str, object]] = []
    for kind in TopologyKind:
        topo = weak_topology(kind)
        for noise in (Noise.REALISTIC, Noise.HEAVY):
            by_fault: dict[str, dict[str, int]] = {}
            for fault in WEAK_FAULTS[kind]:
                if fault is WeakFault.NOISE_ONLY:
                    continue
                row = by_fault[fault.value] = {"named": 0, "watched_only": 0, "neither": 0}
                for s in range(seeds):
                    named, watched, _ = _stream(topo, generate_weak(topo, kind, fault, noise, s, Split.HELDOUT))
                    row["named" if named else "watched_only" if watched else "neither"] += 1
            sizes: list[int] = []
            for s in range(seeds):
                sc = generate_weak(topo, kind, WeakFault.NOISE_ONLY, noise, s, Split.HELDOUT, timedelta(minutes=30))
                sizes += _stream(topo, sc)[2]
            cells.append({"topology": kind.value, "noise": noise.value, "seeds_per_fault": seeds,
                          "by_fault": by_fault, "noise_only_minutes": len(sizes),
                          "noise_only_empty_share": round(sizes.count(0) / max(1, len(sizes)), 3),
                          "noise_only_largest": max(sizes, default=0)})
            missed = sum(r["watched_only"] + r["neither"] for r in by_fault.values())
            caught = sum(r["watched_only"] for r in by_fault.values())
            print(f"{kind.value:5} {noise.value:9}: of {missed} scenarios without a verdict on the truth, "
                  f"{caught} watched; noise-only minutes with an empty list "
                  f"{100 * sizes.count(0) / max(1, len(sizes)):.0f} %", flush=True)
    return {"split": Split.HELDOUT.value, "cells": cells}
