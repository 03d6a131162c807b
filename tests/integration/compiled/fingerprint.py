"""Print one line per generated stream: every verdict change the engine streamed and its final suspects,
fed three ways (``observe`` a FileEvent, ``observe_fields`` as the CLI reads a file, and
``observe_health_event`` as the controller feeds it).

Run as ``python -m tests.integration.compiled.fingerprint`` by ``test_compiled_build.py``, once on the
pure-Python package and once on the compiled wheel: the two outputs must be equal, byte for byte. The
streams are the weak suite (every fault type on both topologies, realistic and heavy noise, both
splits: moves, late events, noise-only windows) and the strong suite with heavy noise. The first line
says which build ran (``gpufleet.correlate.compiled.describe()``), so the caller can check it.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator

from gpufleet.correlate import compiled
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import Verdict
from gpufleet.correlate.scenarios import FAULTS, Noise, Scenario, TopologyKind, generate
from gpufleet.correlate.weak import WEAK_FAULTS, Split, generate_weak, weak_topology
from gpufleet.domain.eventio import FileEvent, format_event, read_event_fields
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.topology import Topology

LEGS = ("observe", "fields", "health")  # Engine.observe, .observe_fields (CLI), .observe_health_event (controller)


def _health(ev: FileEvent, i: int) -> HealthEvent:
    """The event as the controller hands it to the engine (a topology id as component and node)."""
    attrs: tuple[tuple[str, str], ...] = ()
    if ev.kind is EventKind.MOVED:
        attrs = (("serial", ev.serial or ""), ("from", ev.from_slot or ""), ("to", ev.to_slot or ""))
    return HealthEvent(id=f"e{i}", node=ev.component, kind=ev.kind, time=ev.time, component=ev.component,
                       code=ev.code, severity=ev.severity, link=ev.link, attrs=attrs)


def _feed(leg: str, sc: Scenario, eng: Engine) -> Iterator[list[Verdict]]:
    if leg == "observe":
        return (eng.observe(ev) for ev in sc.events)
    if leg == "fields":  # the CLI's file path: JSON lines parsed into EventFields tuples
        return (eng.observe_fields(f) for f in read_event_fields(format_event(ev) for ev in sc.events))
    return (eng.observe_health_event(_health(ev, i)) for i, ev in enumerate(sc.events))


def _line(name: str, sc: Scenario, topo: Topology) -> str:
    parts = []
    for leg in LEGS:
        eng = Engine(topo)
        h = hashlib.sha256()
        changes = 0
        for verdicts in _feed(leg, sc, eng):
            for v in verdicts:
                changes += 1
                h.update(repr(v).encode())
        h.update(repr(eng.suspects()).encode())
        parts.append(f"{leg}:{changes}:{h.hexdigest()[:16]}")
    return f"{name} events={len(sc.events)} " + " ".join(parts)


def main(seeds: int) -> None:
    print(compiled.describe(), flush=True)
    for kind in (TopologyKind.HGX, TopologyKind.NVL72):
        topo = weak_topology(kind)
        for split in Split:
            for noise in (Noise.REALISTIC, Noise.HEAVY):
                for fault in WEAK_FAULTS[kind]:
                    for seed in range(seeds):
                        sc = generate_weak(topo, kind, fault, noise, seed, split)
                        print(_line(f"weak/{kind}/{split}/{noise}/{fault}/{seed}", sc, topo), flush=True)
        for fault in FAULTS[kind]:
            for seed in range(seeds):
                sc = generate(topo, kind, fault, Noise.HEAVY, seed)
                print(_line(f"strong/{kind}/{fault}/{seed}", sc, topo), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
