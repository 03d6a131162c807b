"""Correlation v2 at scale (issue #14): the engine's bare loop with the coherence statistic (v2) vs
counts only (v1), events per CPU-second on a 16,384-node HGX topology (131,072 GPUs; ``--quick``:
1,024 nodes), both in the same run, alternating stream by stream.

Streams: every HGX fault type once with realistic noise and once with heavy noise (5x), a fresh
engine per stream, as in ``bench_correlate``'s bare loop. Two passes over the same streams: the first
starts with nothing memoised for the topology (exposures, kinds, units, placements: shared by engines
on one topology, see gpufleet.correlate.index), the second finds what the first left there, as a
long-running engine would; a third pass runs as the second with the controller's collector thresholds
(``gpufleet.controller.heap.tune``: young collections every 10,000 allocations, not 700), which is how
``controller serve`` runs the engine. ``python -m bench correlate_scale`` (a few minutes at full size);
``bench_correlate`` runs this comparison too, but only after its other parts warmed the topology.
"""

from __future__ import annotations

import gc
import statistics
import time

from gpufleet.controller import heap
from gpufleet.correlate import compiled
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.scenarios import FAULTS, Noise, TopologyKind, generate
from gpufleet.domain.topology_gen import generate_hgx


def run(quick: bool) -> dict[str, object]:
    nodes = 1024 if quick else 16384
    topo = generate_hgx(nodes)
    gc.collect()
    gc.freeze()  # long-lived, like the topology the CLI loads
    streams = [
        generate(topo, TopologyKind.HGX, f, noise, seed).events
        for noise, seed in ((Noise.REALISTIC, 0), (Noise.HEAVY, 100))
        for f in FAULTS[TopologyKind.HGX]
    ]
    gc.collect()
    gc.freeze()  # the inputs too (the CLI streams them from a file)
    events = sum(len(s) for s in streams)
    out: dict[str, object] = {"gpus": nodes * 8, "streams": len(streams), "events": events,
                              "build": compiled.describe()}  # python or compiled (bench_compiled runs both)
    default = gc.get_threshold()
    for phase in ("first_pass", "second_pass", "controller_collector"):
        if phase == "controller_collector":  # the controller's collector settings (controller.heap.tune)
            heap.tune()
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu = {False: 0.0, True: 0.0}
        for evs in streams:
            for coherence in (False, True):
                eng = Engine(topo, coherence=coherence)
                c0 = time.process_time()
                for ev in evs:
                    eng.observe(ev)
                dt = max(1e-9, time.process_time() - c0)
                rates[coherence].append(len(evs) / dt)
                cpu[coherence] += dt
        out[phase] = {
            "v2_coherence_events_per_cpu_s": round(events / cpu[True]),
            "v1_counts_only_events_per_cpu_s": round(events / cpu[False]),
            "v2_over_v1": round(cpu[False] / cpu[True], 3),
            "v2_median_of_streams": round(statistics.median(rates[True])),
            "v1_median_of_streams": round(statistics.median(rates[False])),
        }
    gc.set_threshold(*default)
    gc.unfreeze()
    return out
