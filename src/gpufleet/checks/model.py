"""The values every check produces: levels, statuses, one result per (check, GPU), and a run's report.

Pure: no torch, no I/O. A :class:`CheckResult` always carries the measured value, the expected value
(None when no baseline applies), the signed margin to it and a pass/warn/fail status, so a reader can
see *why* a result failed without re-running anything.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.domain.errors import InvalidInput

REPORT_FORMAT = "gpufleet.check/v1"  # what ``gpufleet check --json`` prints


class Level(StrEnum):
    """How much to run. quick fits a Slurm prolog (≤ 60 s per node); full ≤ 10 min; burnin runs the
    full suite plus a soak of a configurable length; multinode runs collectives across an allocation."""

    QUICK = "quick"
    FULL = "full"
    BURNIN = "burnin"
    MULTINODE = "multinode"


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2}


def worst_status(statuses: list[Status]) -> Status:
    """The worst of ``statuses`` (PASS for an empty list)."""
    return max(statuses, key=lambda s: s.rank, default=Status.PASS)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One judged measurement.

    ``gpu`` is the GPU index on the node, or None for a node-wide result (all-reduce, multi-node).
    ``node`` is set only when the result is about another node than the one reporting (multinode).
    ``margin`` is ``(value - expected) / expected`` (negative = below expectation), None without an
    expected value. ``fatal`` marks results that mean wrong answers or a dying GPU (SDC, XID), not
    only slowness; it drives the event severity.
    """

    check: str
    gpu: int | None
    value: float
    unit: str
    expected: float | None
    status: Status
    margin: float | None = None
    message: str = ""
    fatal: bool = False
    attrs: tuple[tuple[str, str], ...] = field(default=())
    node: str | None = None  # set when the result is about another node than the reporter (multinode)

    def to_json(self) -> dict[str, object]:
        """The ``--json`` form: at least check, gpu, value, unit, expected, status."""
        out: dict[str, object] = {
            "check": self.check,
            "gpu": self.gpu,
            "value": self.value,
            "unit": self.unit,
            "expected": self.expected,
            "status": str(self.status),
            "margin": self.margin,
            "message": self.message,
        }
        if self.node is not None:
            out["node"] = self.node
        if self.fatal:
            out["fatal"] = True
        if self.attrs:
            out["attrs"] = dict(self.attrs)
        return out


@dataclass(frozen=True, slots=True)
class Report:
    """Everything one ``gpufleet check`` run produced on one node (or, for multinode, the allocation)."""

    node: str
    level: Level
    device: str  # "cuda" or "cpu"
    sku: str
    gpus: int
    results: tuple[CheckResult, ...]
    skipped: tuple[str, ...] = ()  # "check: why" for checks this device cannot run
    wall_s: float = 0.0

    @property
    def status(self) -> Status:
        return worst_status([r.status for r in self.results])

    def to_json(self) -> dict[str, object]:
        return {
            "format": REPORT_FORMAT,
            "node": self.node,
            "level": str(self.level),
            "device": self.device,
            "sku": self.sku,
            "gpus": self.gpus,
            "status": str(self.status),
            "wall_s": round(self.wall_s, 3),
            "skipped": list(self.skipped),
            "results": [r.to_json() for r in self.results],
        }



def measured_gemm_flops(doc: object, dtype: str) -> float:
    """A node's measured dense GEMM ceiling, FLOP/s per GPU, at ``dtype`` (bf16, fp16, tf32, fp8, fp32),
    from a report ``gpufleet check --json`` printed: the median over its GPUs of the ``gemm_<dtype>``
    check's value (TFLOPS). The goodput report divides a run's achieved FLOP/s by it."""
    if not isinstance(doc, dict) or doc.get("format") != REPORT_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidInput("format", got, f"{REPORT_FORMAT} (the output of gpufleet check --json)")
    results = doc.get("results")
    if not isinstance(results, list):
        raise InvalidInput("results", results, "a list of check results")
    name = f"gemm_{dtype}"
    values = [r["value"] for r in results if isinstance(r, dict) and r.get("check") == name
              and isinstance(r.get("value"), int | float) and not isinstance(r.get("value"), bool)
              and r["value"] > 0]
    if not values:
        ran = sorted({str(r.get("check")) for r in results if isinstance(r, dict)
                      and str(r.get("check", "")).startswith("gemm_")})
        raise InvalidInput("results", f"no {name} value (gemm checks present: {', '.join(ran) or 'none'})",
                           f"a {name} result: the dtype the run trains in, measured on its GPU type")
    return float(statistics.median(values)) * 1e12
