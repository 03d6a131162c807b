"""A restart's rebuilt correlation window against the running engine (decision 0113).

1. Consistency: weak-suite scenarios (held-out split, realistic noise, HGX and NVL72, six fault types)
   after two hours of background. The running engine sees everything; a rebuild replays the last 30
   minutes into a fresh engine, cold (as before) or primed with the two hours before them
   (``Engine.prime``). Counted: rebuilds whose standing actionable verdicts differ from
   the running engine's.
2. Cost: the stream of 12 heavy-noise scenarios with their two-hour warm-ups stored in SQLite through a
   real controller, then read back as the rebuild reads it — ``Store.events_between`` streamed, and
   prepared and primed — and as a list (``Store.events_since``, the window): CPU microseconds per event.
"""

from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Store
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction
from gpufleet.correlate.scenarios import T0, Noise, Scenario, TopologyKind
from gpufleet.correlate.weak import WEAK_FAULTS, Split, WeakFault, generate_weak, weak_topology
from gpufleet.domain.events import HealthEvent
from gpufleet.domain.topology import Topology, to_fleet
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.states import NodeState

FAULTS = (WeakFault.NVSWITCH, WeakFault.NODE, WeakFault.COMPUTE_TRAY, WeakFault.IB_CABLE, WeakFault.LEAF,
          WeakFault.DEGRADING)
WARMUP = timedelta(hours=2)


def health_events(topo: Topology, sc: Scenario, tag: str = "e") -> list[HealthEvent]:
    """The scenario's events as agents would push them: each names its node (a switch's report on a
    host port, the host's)."""
    out = []
    for e in sc.events:
        far = topo.links[e.link].other(e.component) if e.link and e.component else ""
        node = topo.node_of(e.component or "") or topo.node_of(far) or ""
        out.append(HealthEvent(f"{tag}{e.line}", node, e.kind, e.time, e.component, e.code, e.severity, e.link))
    return out


def _acting(engine: Engine) -> frozenset[str]:
    return frozenset(s.component for s in engine.emitted() if s.action is not SuspectAction.OBSERVE)


def consistency(seeds: int) -> dict[str, int]:
    out = {"scenarios": 0, "cold_differs": 0, "primed_differs": 0}
    for kind in TopologyKind:
        topo = weak_topology(kind)
        for fault in (f for f in FAULTS if f in WEAK_FAULTS[kind]):
            for seed in range(seeds):
                events = health_events(topo, generate_weak(topo, kind, fault, Noise.REALISTIC, seed, Split.HELDOUT,
                                                           WARMUP))
                live, cold, primed = Engine(topo), Engine(topo), Engine(topo)
                for e in events:
                    live.observe_health_event(e)
                primed.prime((e for e in events if e.time < T0), T0 - WARMUP)
                for e in events:
                    if e.time >= T0:
                        cold.observe_health_event(e)
                        primed.observe_health_event(e)
                out["scenarios"] += 1
                out["cold_differs"] += _acting(cold) != _acting(live)
                out["primed_differs"] += _acting(primed) != _acting(live)
    return out


def cost(scenarios: int) -> dict[str, float]:
    kind = TopologyKind.HGX
    topo = weak_topology(kind)
    events: list[HealthEvent] = []
    for s in range(scenarios):
        sc = generate_weak(topo, kind, WeakFault.NOISE_ONLY, Noise.HEAVY, s, Split.TUNE, WARMUP)
        events += health_events(topo, sc, f"s{s}-")
    events.sort(key=lambda e: e.time)
    with tempfile.TemporaryDirectory() as d:
        db = make_engine(f"sqlite:///{Path(d) / 'g.db'}")
        migrate(db)
        store = Store(db)
        c = Controller(store, load_policy(), ManualClock(events[-1].time), topology=topo)
        c.register_fleet(to_fleet(topo), NodeState.READY)
        for i in range(0, len(events), 500):
            c.ingest(events[i:i + 500])
        start, end = events[0].time, events[-1].time + timedelta(seconds=1)
        c0 = time.process_time()
        n = sum(1 for _ in store.events_between(start, end))
        read = time.process_time() - c0
        engine = Engine(topo)
        c0 = time.process_time()
        engine.prime(c.admission.prepare_each(store.events_between(start, end)), start)
        primed = time.process_time() - c0
        c0 = time.process_time()
        listed = len(store.events_since(start))
        as_list = time.process_time() - c0
        db.dispose()
    return {"events": n, "listed": listed, "stream_read_us_per_event": round(1e6 * read / n, 1),
            "stream_read_prepare_prime_us_per_event": round(1e6 * primed / n, 1),
            "list_read_us_per_event": round(1e6 * as_list / listed, 1)}


def run(quick: bool) -> dict[str, object]:
    return {"consistency": consistency(5 if quick else 20), "cost": cost(3 if quick else 12)}
