"""Correlation v2 at scale (issue #14): the engine's bare loop with the coherence statistic (v2) vs
counts only (v1), events per CPU-second on a 16,384-node HGX topology (131,072 GPUs; ``--quick``:
1,024 nodes), both in the same run, alternating stream by stream.

Streams: every HGX fault type once with realistic noise and once with heavy noise (5x), a fresh
engine per stream, as in ``bench_correlate``'s bare loop. Two passes over the same streams: the first
starts with nothing memoised for the topology (exposures, kinds, units, placements: shared by engines
on one topology, see gpufleet.correlate.index), the second finds what the first left there, as a
long-running engine would; a third pass runs as the second with the controller's collector thresholds
(``gpufleet.controller.heap.tune``: young collections every 10,000 allocations, not 700), which is how
``controller serve`` runs the engine; then ``long_lived``: ONE engine of each kind over all the streams
placed end to end (each a minute after the last, 9 hours of stream), with the controller's collector, which
is what a controller does (a fresh engine per 30-minute stream never reaches the steady state of a
long-running one: its rate window (2 hours) is never full, its candidates and the collector's oldest
generation never grow to their steady size); a last pass times each ``observe`` call for the verdict latency.
Each of the three passes also reports how much of each engine's CPU time the cycle collector took, by
generation (young, middle, full): the part of the speed goal that is not the engine's own work.
``python -m bench correlate_scale`` (a few minutes at full size);
``bench_correlate`` runs this comparison too, but only after its other parts warmed the topology.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from datetime import timedelta

from gpufleet.controller import heap
from gpufleet.correlate import compiled
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.scenarios import FAULTS, Noise, TopologyKind, generate
from gpufleet.domain.eventio import FileEvent
from gpufleet.domain.topology import Topology
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
        collector = _CollectorClock()
        gc.callbacks.append(collector)
        try:
            for evs in streams:
                for coherence in (False, True):
                    eng = Engine(topo, coherence=coherence)
                    collector.engine = coherence
                    c0 = time.process_time()
                    for ev in evs:
                        eng.observe(ev)
                    dt = max(1e-9, time.process_time() - c0)
                    collector.engine = None
                    rates[coherence].append(len(evs) / dt)
                    cpu[coherence] += dt
        finally:
            gc.callbacks.remove(collector)
        out[phase] = {
            "v2_coherence_events_per_cpu_s": round(events / cpu[True]),
            "v1_counts_only_events_per_cpu_s": round(events / cpu[False]),
            "v2_over_v1": round(cpu[False] / cpu[True], 3),
            "v2_median_of_streams": round(statistics.median(rates[True])),
            "v1_median_of_streams": round(statistics.median(rates[False])),
            "v2_collector": collector.report(True, cpu[True]),
            "v1_collector": collector.report(False, cpu[False]),
        }
    out["long_lived"] = _long_lived(topo, streams)  # still with the controller's collector
    out["verdict_latency"] = _verdict_latency(topo, streams)  # still with the controller's collector
    gc.set_threshold(*default)
    gc.unfreeze()
    return out


class _CollectorClock:
    """A ``gc.callbacks`` entry: CPU seconds of the cycle collections that ran while an engine observed
    events, by engine (``engine``: True coherence, False counts only, None neither) and generation."""

    def __init__(self) -> None:
        self.engine: bool | None = None
        self._began = 0.0
        self._spent: dict[tuple[bool, int], list[float]] = {}  # (engine, generation) -> [collections, s]

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        elif self.engine is not None:
            row = self._spent.setdefault((self.engine, info["generation"]), [0, 0.0])
            row[0] += 1
            row[1] += time.process_time() - self._began

    def report(self, engine: bool, cpu_s: float) -> dict[str, object]:
        """Collections and CPU seconds per generation, and their share of the engine's CPU time."""
        out: dict[str, object] = {}
        total = 0.0
        for gen, name in enumerate(("young", "middle", "full")):
            n, s = self._spent.get((engine, gen), [0, 0.0])
            out[name] = {"collections": int(n), "cpu_s": round(s, 3)}
            total += s
        out["share_of_cpu"] = round(total / cpu_s, 3) if cpu_s > 0 else None
        return out


def _long_lived(topo: Topology, streams: list[tuple[FileEvent, ...]]) -> dict[str, object]:
    """One engine per kind over every stream placed end to end, as a controller runs it: events per CPU
    second over the whole, and per fifth of it (the first fifth is before the rate window is full)."""
    joined: list[FileEvent] = []
    shift = timedelta(0)
    for evs in streams:
        joined.extend(dataclasses.replace(ev, time=ev.time + shift) for ev in evs)
        shift += evs[-1].time - evs[0].time + timedelta(minutes=1)
    out: dict[str, object] = {"events": len(joined), "stream_hours": round(shift.total_seconds() / 3600, 1)}
    fifth = max(1, len(joined) // 5)
    for coherence in (True, False):
        collector = _CollectorClock()
        collector.engine = coherence
        gc.callbacks.append(collector)
        eng = Engine(topo, coherence=coherence)
        clock = time.process_time
        parts: list[int] = []
        c0 = a = clock()
        try:
            for i, ev in enumerate(joined, 1):
                eng.observe(ev)
                if i % fifth == 0:
                    b = clock()
                    parts.append(round(fifth / max(1e-9, b - a)))
                    a = b
            dt = max(1e-9, clock() - c0)
        finally:
            gc.callbacks.remove(collector)
        out["v2_coherence" if coherence else "v1_counts_only"] = {
            "events_per_cpu_s": round(len(joined) / dt), "per_fifth": parts,
            "collector": collector.report(coherence, dt)}
        del eng
    return out


def _verdict_latency(topo: Topology, streams: list[tuple[FileEvent, ...]]) -> dict[str, object]:
    """Issue #14's "verdict <= 1 s after the evidence that decides it": a verdict comes out of the
    ``observe`` call that took the deciding event (the controller correlates inside the ingest request
    that carried it), so its delay in the engine is that call's CPU time. Timed per call here, in a
    pass of its own (the timer costs about what a bare event does), for v2 and v1 alike."""
    out: dict[str, object] = {}
    # CPU seconds in the cycle collector so far, when the running collection began, the oldest generation
    # collected since it was last read
    collecting = [0.0, 0.0, -1]

    def collector(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting[1] = time.process_time()
            collecting[2] = max(int(collecting[2]), info["generation"])
        else:
            collecting[0] += time.process_time() - collecting[1]

    gc.callbacks.append(collector)
    try:
        for coherence in (True, False):
            verdict_calls: list[float] = []
            slowest: dict[str, tuple[float, float, int]] = {}  # verdict / any call: (s, of it collector, gen)
            for evs in streams:
                eng = Engine(topo, coherence=coherence)
                clock = time.process_time
                for ev in evs:
                    g, collecting[2], a = collecting[0], -1, clock()
                    changed = eng.observe(ev)
                    dt = clock() - a
                    call = (dt, collecting[0] - g, int(collecting[2]))
                    if changed:
                        verdict_calls.append(dt)
                        if dt > slowest.get("verdict", (0.0, 0.0, -1))[0]:
                            slowest["verdict"] = call
                    if dt > slowest.get("any", (0.0, 0.0, -1))[0]:
                        slowest["any"] = call
            verdict_calls.sort()
            row: dict[str, object] = {
                "verdict_calls": len(verdict_calls),
                "verdict_ms_p50": _ms(verdict_calls, 0.5),
                "verdict_ms_p99": _ms(verdict_calls, 0.99),
                "verdict_ms_max": _ms(verdict_calls, 1.0),
            }
            for which, (dt, gc_s, gen) in slowest.items():
                # the slowest call: its CPU time, the cycle collector's part of it, the oldest generation
                # it collected (2: a full collection; -1: none)
                row[f"slowest_{which}_call"] = {"ms": round(1000 * dt, 2), "collector_ms": round(1000 * gc_s, 2),
                                                "generation": gen}
            out["v2_coherence" if coherence else "v1_counts_only"] = row
    finally:
        gc.callbacks.remove(collector)
    return out


def _ms(sorted_s: list[float], q: float) -> float | None:
    return round(1000 * sorted_s[round(q * (len(sorted_s) - 1))], 3) if sorted_s else None
