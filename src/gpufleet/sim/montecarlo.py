"""Monte Carlo over replicas, and the summary the CLI prints (``--json`` schema in docs/simulator.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufleet.goodput import theory
from gpufleet.sim.config import SimConfig
from gpufleet.sim.control import NodeControl
from gpufleet.sim.engine import ReplicaResult, run_replica
from gpufleet.sim.trace import FaultTrace

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class Summary:
    config: SimConfig
    replicas: tuple[ReplicaResult, ...]
    label: str = ""

    @property
    def ettrs(self) -> list[float]:
        return [r.report.ettr for r in self.replicas]

    def ettr_mean(self) -> float:
        return _mean(self.ettrs)

    def ettr_stderr(self) -> float:
        xs = self.ettrs
        if len(xs) < 2:
            return 0.0
        m = _mean(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))

    def ettr_ci95(self) -> tuple[float, float]:
        """95 % confidence interval of the mean ETTR over the replicas (Student's t; one replica: the
        point itself)."""
        m, se, n = self.ettr_mean(), self.ettr_stderr(), len(self.replicas)
        half = t_975(n - 1) * se if n > 1 else 0.0
        return m - half, m + half

    def mean_interruptions(self) -> dict[str, float]:
        n = len(self.replicas)
        out = {"total": 0.0, "planned": 0.0, "unexpected": 0.0}
        for r in self.replicas:
            i = r.report.interruptions
            out["total"] += i.total / n
            out["planned"] += i.planned / n
            out["unexpected"] += i.unexpected / n
        return out

    def mean_by_cause(self) -> dict[str, float]:
        n = len(self.replicas)
        acc: dict[str, float] = {}
        for r in self.replicas:
            for cause, count in r.report.interruptions.by_cause:
                acc[cause] = acc.get(cause, 0.0) + count / n
        return dict(sorted(acc.items(), key=lambda kv: (-kv[1], kv[0])))

    def mean_badput_hours(self) -> dict[str, float]:
        n = len(self.replicas)
        acc: dict[str, float] = {}
        for r in self.replicas:
            for k, v in r.report.badput.as_dict().items():
                acc[k] = acc.get(k, 0.0) + v / HOUR / n
        return acc

    def mttf_hours(self) -> float | None:
        held = [r.report.mttf for r in self.replicas if r.report.mttf is not None]
        return _mean(held) / HOUR if held else None

    def theory(self) -> dict[str, float | None]:
        cfg = self.config
        m = cfg.mtbf()
        if not math.isfinite(m):
            return {"mtbf_hours": None, "young_interval_s": None, "daly_interval_s": None,
                    "ettr_first_order": 1.0, "ettr_exact": None}
        write = cfg.checkpoint_write
        restart = cfg.restart_overhead + cfg.restore + cfg.requeue
        return {
            "mtbf_hours": m / HOUR,
            "young_interval_s": theory.young_interval(write, m),
            "daly_interval_s": theory.daly_interval(write, m),
            "ettr_first_order": theory.expected_ettr_approx(
                cfg.nodes, 86400.0 / m / cfg.nodes, restart, cfg.interval(), write),
            "ettr_exact": theory.expected_ettr_exact(1.0 / m, cfg.interval(), write, restart),
        }

    def to_json(self) -> dict[str, object]:
        cfg = self.config
        rule = cfg.checkpoint_interval
        ettrs = sorted(self.ettrs)
        inter = self.mean_interruptions()
        return {
            "scenario": cfg.name,
            "label": self.label,
            "gpus": cfg.gpus,
            "nodes": cfg.nodes,
            "days": cfg.days,
            "replicas": len(self.replicas),
            "seeds": [r.seed for r in self.replicas],
            "interruptions": {**inter, "by_cause": self.mean_by_cause()},
            "ettr": {
                "mean": self.ettr_mean(),
                "p5": _quantile(ettrs, 0.05),
                "p95": _quantile(ettrs, 0.95),
                "stderr": self.ettr_stderr(),
                "ci95": list(self.ettr_ci95()),
            },
            "mttf_hours": self.mttf_hours(),
            "badput": {"hours": self.mean_badput_hours(),
                       "fraction": {k: v * HOUR / cfg.horizon for k, v in self.mean_badput_hours().items()}},
            "policy": {
                "checkpoint_interval_s": cfg.interval(),
                "checkpoint_rule": str(rule) if isinstance(rule, str) else "fixed",
                "checkpoint_write_s": cfg.checkpoint_write,
                "checkpoint_persist_s": cfg.checkpoint_persist,
                "restart_overhead_s": cfg.restart_overhead,
                "restore_s": cfg.restore,
                "hot_spares": cfg.hot_spares,
                "warning_fraction": cfg.warning_fraction,
                "proactive_drain": cfg.proactive_drain,
                "health_check_every_s": cfg.health_check_every,
                "health_check_cost_s": cfg.health_check_cost,
                "repair_model": cfg.repair.name,
                "repair_escape": cfg.repair_escape,
                "revalidation_s": cfg.revalidation,
            },
            "spares": {
                "peak_in_repair_max": max((r.peak_in_repair for r in self.replicas), default=0),
                "restarts_waiting_for_nodes": _mean([float(r.node_waits) for r in self.replicas]),
                "escaped_repairs": _mean([float(r.escapes) for r in self.replicas]),
            },
            "theory": self.theory(),
        }


def run_many(
    cfg: SimConfig,
    replicas: int,
    seed: int,
    *,
    trace: FaultTrace | None = None,
    control_factory: Callable[[SimConfig], NodeControl] | None = None,
    progress: Callable[[int], None] | None = None,
    label: str = "",
) -> Summary:
    """``replicas`` independent replicas with seeds ``seed, seed+1, ...``."""
    out = []
    for i in range(replicas):
        ctl = control_factory(cfg) if control_factory is not None else None
        out.append(run_replica(cfg, seed + i, control=ctl, trace=trace))
        if progress is not None:
            progress(i + 1)
    return Summary(cfg, tuple(out), label)


# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (any statistics table).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t_975(df: int) -> float:
    """The t quantile for a 95 % interval with ``df`` degrees of freedom (above 30: 1.96 + 2.46/df, within
    0.001 of the exact value)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.46 / df


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    if not sorted_xs:
        return 0.0
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)
