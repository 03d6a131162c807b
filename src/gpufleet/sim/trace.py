"""Recorded node fault traces: StepFun's InfiniteHBD trace and how its classes map to gpufleet's.

Format (github.com/stepfun-ai/InfiniteHBD-Trace, Apache-2.0; arXiv:2502.03885): one JSON array of
``{"node_id", "event_time" (days since the first event), "event_type": "fault_start"|"fault_end",
"fault_type": {"Level", "Class", "Desc"}}``. A fault runs from its ``fault_start`` to the next
``fault_end`` with the same node and fault type; that span is the recorded repair time.

Each fault gets an *effect* on a training job running on the node:

* ``interrupt`` — the node stops working under the job (GPU lost / DBE / xid, link down, NIC lost,
  motherboard, CPU MCE, kernel panic, file-system errors, server down, "Suspect Machine Offline"
  found while troubleshooting a training task, and the unexplained "Unknown Error" classes).
* ``degraded`` — the node still runs but is out of spec (fan speed critical, PSU failure on a
  redundant supply, link speed/width low, P2P bandwidth low, temperature high, SBE over threshold,
  battery, RAID/riser correctable errors, kubelet data absent, firmware mismatch, CPU configuration).
  An operator takes it out; a job loses nothing if it is drained at a checkpoint (planned).
* ``burn_in`` — findings of stress tests and test runs, and operator changes (``Stress Test
  Failure``, ``Test``, ``Change``). These are found on nodes that are out of service for testing, so
  they never interrupt the job; the node is only unavailable as a spare.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpufleet.domain.errors import InvalidInput

DAY = 86400.0


class Effect(StrEnum):
    INTERRUPT = "interrupt"
    DEGRADED = "degraded"
    BURN_IN = "burn_in"


# (Level, Class) -> (gpufleet category, default effect); Desc-level exceptions below.
_CLASS_MAP: dict[tuple[str, str], tuple[str, Effect]] = {
    ("Hardware Failure", "GPU"): ("gpu", Effect.INTERRUPT),
    ("Hardware Failure", "Parameter Plane Cable"): ("network", Effect.INTERRUPT),
    ("Hardware Failure", "NIC"): ("nic", Effect.INTERRUPT),
    ("Hardware Failure", "Power Supply"): ("power_supply", Effect.DEGRADED),
    ("Hardware Failure", "Fan"): ("cooling", Effect.DEGRADED),
    ("Hardware Failure", "Motherboard Battery"): ("host", Effect.DEGRADED),
    ("Hardware Failure", "Other Failures"): ("host", Effect.INTERRUPT),
    ("Hardware Failure", "Motherboard"): ("host", Effect.INTERRUPT),
    ("Hardware Failure", "CPU"): ("cpu", Effect.INTERRUPT),
    ("Hardware Failure", "RAID Card"): ("host", Effect.DEGRADED),
    ("Hardware Failure", "Riser Card"): ("host", Effect.DEGRADED),
    ("Software Failure", "Other Failures"): ("software", Effect.INTERRUPT),
    ("Software Failure", "File System"): ("software", Effect.INTERRUPT),
    ("Software Failure", "Software Tool"): ("software", Effect.DEGRADED),
    ("Software Failure", "Operating System"): ("software", Effect.INTERRUPT),
    ("Software Failure", "Firmware"): ("software", Effect.DEGRADED),
    ("Other Failure", "Unknown Error"): ("unknown", Effect.INTERRUPT),
    ("Other Failure", "System Crash"): ("host", Effect.INTERRUPT),
    ("Other Failure", "Stress Test Failure"): ("stress_test", Effect.BURN_IN),
    ("Other Failure", "Change"): ("change", Effect.BURN_IN),
    ("Other Failure", "Training Task Troubleshooting"): ("suspect_node", Effect.INTERRUPT),
    ("Other Failure", "Test"): ("test", Effect.BURN_IN),
}
_DEGRADED_DESC = frozenset({
    "GPU Temperature High", "GPU PCI link width low", "GPU SBE(Single Bit ECC) > Threshold",
    "GPU P2P Bandwidth Low", "NIC Link Speed low", "NIC PCI link Width low", "Configuration Error",
})


@dataclass(frozen=True, slots=True)
class TraceFault:
    node: str
    start: float  # seconds from the first event
    end: float
    level: str
    cls: str
    desc: str
    category: str
    effect: Effect

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class FaultTrace:
    faults: tuple[TraceFault, ...]
    nodes: int  # servers observed (faulting or not)
    span: float  # seconds covered

    def node_ids(self) -> list[str]:
        """The faulting nodes in order of first fault."""
        seen: dict[str, None] = {}
        for f in self.faults:
            seen.setdefault(f.node, None)
        return list(seen)

    def rate_per_node_day(self, effect: Effect = Effect.INTERRUPT) -> float:
        n = sum(1 for f in self.faults if f.effect is effect)
        return n / (self.nodes * self.span / DAY)

    def repair_days(self, effect: Effect = Effect.INTERRUPT) -> list[float]:
        return sorted(f.duration / DAY for f in self.faults if f.effect is effect)


def classify(level: str, cls: str, desc: str) -> tuple[str, Effect]:
    """gpufleet's category and the effect on a running job for one trace fault type."""
    category, effect = _CLASS_MAP.get((level, cls), ("unknown", Effect.INTERRUPT))
    if desc in _DEGRADED_DESC:
        effect = Effect.DEGRADED
    return category, effect


def parse_trace(doc: Any, *, nodes: int | None = None, source: str = "trace") -> FaultTrace:
    """Pair fault_start/fault_end events into faults. ``nodes`` is the observed server count (the
    InfiniteHBD trace has 400 servers, of which only 231 ever fault); default: the faulting ones."""
    if not isinstance(doc, list):
        raise InvalidInput(source, type(doc).__name__, "a JSON array of fault events")
    open_: dict[tuple[str, str, str, str], float] = {}
    faults: list[TraceFault] = []
    last = 0.0
    for i, ev in enumerate(doc):
        path = f"{source}[{i}]"
        if not isinstance(ev, dict):
            raise InvalidInput(path, ev, "an object with node_id, event_time, event_type, fault_type")
        node, when, kind, ftype = ev.get("node_id"), ev.get("event_time"), ev.get("event_type"), ev.get("fault_type")
        if not isinstance(node, str) or not node:
            raise InvalidInput(f"{path}.node_id", node, "a node id string")
        if isinstance(when, bool) or not isinstance(when, int | float) or when < 0:
            raise InvalidInput(f"{path}.event_time", when, "days >= 0 since the first event")
        if kind not in ("fault_start", "fault_end"):
            raise InvalidInput(f"{path}.event_type", kind, "fault_start or fault_end")
        if not isinstance(ftype, dict) or not all(isinstance(ftype.get(k), str) for k in ("Level", "Class", "Desc")):
            raise InvalidInput(f"{path}.fault_type", ftype, "an object with string Level, Class and Desc")
        key = (node, ftype["Level"], ftype["Class"], ftype["Desc"])
        t = float(when) * DAY
        last = max(last, t)
        if kind == "fault_start":
            open_.setdefault(key, t)
        elif key in open_:
            start = open_.pop(key)
            category, effect = classify(*key[1:])
            faults.append(TraceFault(node, start, t, key[1], key[2], key[3], category, effect))
    for key, start in open_.items():  # never repaired within the trace: repaired at its end
        category, effect = classify(*key[1:])
        faults.append(TraceFault(key[0], start, last, key[1], key[2], key[3], category, effect))
    faults.sort(key=lambda f: (f.start, f.node))
    observed = len({f.node for f in faults})
    if nodes is not None and nodes < observed:
        raise InvalidInput("trace_nodes", nodes, f"at least the {observed} nodes that appear in the trace")
    return FaultTrace(tuple(faults), nodes or observed, last)


def load_trace(path: Path | str, *, nodes: int | None = None) -> FaultTrace:
    """Read a trace file. For the InfiniteHBD trace pass ``nodes=400`` (its README's server count);
    a file named ``fault_trace.json`` whose README mentions 400 servers gets that by default."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput("trace", str(p), "an existing trace file") from None
    except json.JSONDecodeError as err:
        raise InvalidInput("trace", str(p), f"valid JSON ({err})") from None
    if nodes is None and p.name == "fault_trace.json":
        readme = p.with_name("README.md")
        if readme.exists() and "**400** GPU servers" in readme.read_text(encoding="utf-8"):
            nodes = INFINITEHBD_SERVERS
    return parse_trace(doc, nodes=nodes, source=str(p.name))


INFINITEHBD_SERVERS = 400


def summarize(trace: FaultTrace) -> dict[str, dict[str, int]]:
    """Fault counts per effect and gpufleet category."""
    out: dict[str, dict[str, int]] = {}
    for f in trace.faults:
        per = out.setdefault(f.effect.value, {})
        per[f.category] = per.get(f.category, 0) + 1
    return out


def durations_quantiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Empirical quantiles (nearest rank) of sorted ``values``."""
    if not values:
        return [0.0 for _ in qs]
    n = len(values)
    return [values[min(n - 1, max(0, round(q * (n - 1))))] for q in qs]
