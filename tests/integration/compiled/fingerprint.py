"""Print one line per generated stream: every verdict change the engine streamed and its final suspects.

Run as ``python -m tests.integration.compiled.fingerprint`` by ``test_compiled_build.py``, once on the
pure-Python package and once on the compiled wheel: the two outputs must be equal, byte for byte. The
streams are the weak suite (every fault type on both topologies, realistic and heavy noise, both
splits: moves, late events, noise-only windows) and the strong suite with heavy noise. The first line
says which build ran (``gpufleet.correlate.compiled.describe()``), so the caller can check it.
"""

from __future__ import annotations

import hashlib
import sys

from gpufleet.correlate import compiled
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.scenarios import FAULTS, Noise, Scenario, TopologyKind, generate
from gpufleet.correlate.weak import WEAK_FAULTS, Split, generate_weak, weak_topology


def _line(name: str, sc: Scenario, eng: Engine) -> str:
    h = hashlib.sha256()
    changes = 0
    for ev in sc.events:
        for v in eng.observe(ev):
            changes += 1
            h.update(repr(v).encode())
    h.update(repr(eng.suspects()).encode())
    return f"{name} events={len(sc.events)} changes={changes} {h.hexdigest()[:20]}"


def main(seeds: int) -> None:
    print(compiled.describe(), flush=True)
    for kind in (TopologyKind.HGX, TopologyKind.NVL72):
        topo = weak_topology(kind)
        for split in Split:
            for noise in (Noise.REALISTIC, Noise.HEAVY):
                for fault in WEAK_FAULTS[kind]:
                    for seed in range(seeds):
                        sc = generate_weak(topo, kind, fault, noise, seed, split)
                        print(_line(f"weak/{kind}/{split}/{noise}/{fault}/{seed}", sc, Engine(topo)), flush=True)
        for fault in FAULTS[kind]:
            for seed in range(seeds):
                sc = generate(topo, kind, fault, Noise.HEAVY, seed)
                print(_line(f"strong/{kind}/{fault}/{seed}", sc, Engine(topo)), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
