"""Survey the agent's NVML fields on this node's real GPUs: value, None (not available) and why, and cost.

    python scripts/nvml_survey.py [--reads 20] > survey.json

Opens the agent's own NVML backend (``gpufleet.agent.devices.nvml.NvmlDevice``, the code the agent runs),
reads every GPU's fast and slow fields ``--reads`` times, and prints one JSON document: the device status,
each GPU's identity, the last fast and slow reading field by field, the fields the backend gave up on
(NOT_SUPPORTED) with NVML's words, the mean wall time of one fast and one slow read per GPU, and whether
the XID event set opened and delivered anything in a short wait. Run it on each new GPU generation and
record the result in docs/benchmarks.md (§agent, field survey). Exit status 2 when NVML cannot start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from gpufleet.agent.devices.nvml import NvmlDevice


def _reading(obj: Any) -> dict[str, Any]:
    doc = dataclasses.asdict(obj)
    if "nvlinks" in doc:
        links = doc.pop("nvlinks")
        doc["nvlinks_total"] = len(links)
        doc["nvlinks_up"] = sum(1 for link in links if link.get("up"))
        doc["nvlink_first"] = links[0] if links else None
    return doc


def main(argv: list[str] | None = None, device: NvmlDevice | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reads", type=int, default=20, help="reads of each kind per GPU, for the mean cost")
    p.add_argument("--xid-wait", type=float, default=1.0, help="seconds to wait on the XID event set")
    a = p.parse_args(argv)
    if a.reads < 1:
        p.error(f"--reads: {a.reads} is not a positive count")
    dev = device if device is not None else NvmlDevice()
    status = dev.open()
    out: dict[str, Any] = {"status": dataclasses.asdict(status)}
    if not status.ok:
        json.dump(out, sys.stdout, indent=2)
        return 2
    gpus = []
    for info in dev.gpus():
        i = info.index
        t0 = time.perf_counter()
        for _ in range(a.reads):
            fast = dev.read_fast(i)
        t1 = time.perf_counter()
        for _ in range(a.reads):
            slow = dev.read_slow(i)
        t2 = time.perf_counter()
        gpus.append({
            "info": dataclasses.asdict(info),
            "fast": _reading(fast),
            "slow": _reading(slow),
            "fast_read_ms": round(1000 * (t1 - t0) / a.reads, 3),
            "slow_read_ms": round(1000 * (t2 - t1) / a.reads, 3),
            "none_fields": sorted(k for r in (fast, slow) for k, v in dataclasses.asdict(r).items() if v is None),
        })
    out["gpus"] = gpus
    t0 = time.perf_counter()
    xids = dev.wait_xids(a.xid_wait)
    out["xid_wait"] = {"waited_s": round(time.perf_counter() - t0, 3), "events": [dataclasses.asdict(x) for x in xids]}
    dev.close()
    json.dump(out, sys.stdout, indent=2, default=str)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
