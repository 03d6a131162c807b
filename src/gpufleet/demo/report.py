"""The demo's summary: what the run did, as one JSON-able dict (``gpufleet demo --json``) and lines.

Keys (a contract for scripts, documented in the README tour): ``nodes``, ``job_nodes``,
``interruptions``, ``drained``, ``returned_to_service``, ``ettr``, ..., ``correlated`` (one entry per
decision the correlator made for a shared component: ``component``, ``kind``, ``nodes`` it took out,
``nodes_behind`` it in the topology, ``decision`` as the controller first made it, ``at``, ``outcome``,
``summary`` in words) and ``timeline`` (what happened, in order).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.lifecycle.states import NodeState
from gpufleet.lifecycle.ttm import cluster_ttm

if TYPE_CHECKING:
    from gpufleet.demo.world import World

START = datetime(2026, 11, 21, 0, 0, tzinfo=UTC)


def hm(t: datetime) -> str:
    """``t`` as an offset from the start of the run: ``+07:02``."""
    s = int((t - START).total_seconds())
    return f"+{s // 3600:02d}:{s % 3600 // 60:02d}"


@dataclass(slots=True)
class Correlated:
    """One component fault from the correlator: ONE decision for every node behind the component."""

    component: str
    kind: str  # the topology's kind of the component (leaf_switch, nvswitch, ...) or of the link
    at: datetime
    decision: DecisionStatus  # as the controller made it: applied, or held by the breaker
    behind: frozenset[str]  # the topology's nodes behind the component (Topology.nodes_behind)
    nodes: set[str] = field(default_factory=set)  # those the decision took out (the others were out already)
    outcome: str = ""

    def line(self) -> str:
        """``leaf-su1-r3 (leaf_switch): 1 decision for 32 nodes at +07:08, held by the breaker; ...``"""
        made = "held by the breaker" if self.decision == DecisionStatus.HELD else self.decision.value
        out = len(self.behind - self.nodes)
        already = f" (of the {len(self.behind)} behind it; {out} already out of service)" if out else ""
        return (f"{self.component} ({self.kind}): 1 decision for {len(self.nodes)} nodes{already} at "
                f"{hm(self.at)}, {made}" + (f"; {self.outcome}" if self.outcome else ""))

    def as_json(self) -> dict[str, object]:
        return {"component": self.component, "kind": self.kind, "nodes": sorted(self.nodes),
                "nodes_behind": len(self.behind), "decision": self.decision.value, "at": hm(self.at),
                "outcome": self.outcome or None, "summary": self.line()}


def summarise(w: World) -> dict[str, object]:
    drained = sorted({t.node for t in w.transitions if t.to_state == NodeState.DRAINING})
    returned = [t for t in w.transitions if t.from_state == NodeState.REVALIDATE and t.to_state == NodeState.READY]
    repaired = [t for t in w.transitions if t.to_state == NodeState.REVALIDATE]
    d2d: dict[bool, list[float]] = {True: [], False: []}
    for n, (t0, fatal) in w.detect.items():
        if n in w.scheduler.drained_at and w.scheduler.drained_at[n] >= t0:
            d2d[fatal].append((w.scheduler.drained_at[n] - t0).total_seconds())
    status = Counter(d.status.value for d in w.decisions)
    report = w.job.report(w.clock.now())
    return {
        "seed": w.seed,
        "duration_hours": w.duration.total_seconds() / 3600,
        "nodes": len(w.fleet),
        "racks": len(w.fleet.racks()),
        "job_nodes": w.job.size,
        "interruptions": w.job.interruptions,
        "interruption_causes": dict(Counter(w.job.causes)),
        "drained": len(drained),
        "drained_nodes": drained,
        "repaired": len(repaired),
        "returned_to_service": len(returned),
        # nodes that came back from repair through a validation run (each counted once)
        "revalidated": len({t.node for t in returned}),
        # time to market of the whole fleet (the delivered spares go through burn-in): lifecycle.ttm
        "ttm": cluster_ttm(w.controller.store.histories()).as_dict(per_node=False),
        "detect_to_drain_s": {
            kind: {"count": len(v), "median": statistics.median(v) if v else None, "max": max(v) if v else None}
            for kind, v in (("fatal", d2d[True]), ("degraded_after_checkpoint", d2d[False]))},
        "breaker_trips": w.breaker_trips,
        "decisions": dict(status),
        "correlated": [c.as_json() for c in sorted(w.correlated.values(), key=lambda c: c.at)],
        "ettr": round(report.ettr, 4),
        "mttf_hours": round(report.mttf / 3600, 2) if report.mttf else None,
        "badput_hours": {k: round(v / 3600, 3) for k, v in asdict(report.badput).items() if v},
        "final_states": dict(Counter(w.controller.state_of(n.id).value for n in w.fleet)),
        "timeline": list(w.log),
    }
