"""What one simulated training campaign looks like: cluster, failure model, job and policies.

All durations are seconds. ``checkpoint_interval`` is either seconds or a rule (``young``/``daly``)
resolved against the job's unexpected-failure MTBF and the blocking checkpoint cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput import theory
from gpufleet.sim.failures import FailureCategory, llama3_categories, llama3_planned_per_node_day
from gpufleet.sim.repair import RepairModel, default_repair

DAY = 86400.0


class IntervalRule(StrEnum):
    YOUNG = "young"
    DALY = "daly"


@dataclass(frozen=True, slots=True)
class SimConfig:
    name: str = "custom"
    gpus: int = 1024
    gpus_per_node: int = 8
    days: float = 30.0
    categories: tuple[FailureCategory, ...] = field(default_factory=llama3_categories)
    planned_per_node_day: float = field(default_factory=llama3_planned_per_node_day)
    maintenance_downtime: float = 300.0  # extra time down after a planned stop, before the restart
    checkpoint_interval: float | IntervalRule = 1800.0  # training time between checkpoint snapshots
    checkpoint_write: float = 60.0  # training blocked per checkpoint
    checkpoint_persist: float = 0.0  # > 0: asynchronous; durable this long after the blocking part
    restart_overhead: float = 300.0  # start -> initialised (launch, communicators, warm-up)
    restore: float = 0.0  # loading the checkpoint after a restart
    requeue: float = 0.0  # detected -> restarted when nodes are available (scheduler latency)
    hot_spares: int | None = None  # None: a replacement is always available at once
    repair: RepairModel = field(default_factory=default_repair)
    warning_fraction: float = 0.0  # share of warnable failures that announce themselves
    warning_lead: float = 1800.0  # how long before the failure the warning comes
    proactive_drain: bool = False  # drain a warned node at a checkpoint taken at once
    health_check_every: float = 0.0  # in-job health-check cadence (0: none)
    health_check_cost: float = 0.0  # training paused per health check
    watchdog: float = 600.0  # collective watchdog timeout: how long a hang goes unnoticed
    silent_detection: float = 4 * 3600.0  # silent data corruption noticed (loss spike) without checks
    repair_escape: float = 0.0  # share of repairs that return the node with its fault still there
    escape_refail_mean: float = 6 * 3600.0  # such a node fails again after this long in service (mean)
    revalidation: float = 0.0  # post-repair validation before the node serves again (0: none)
    revalidation_catch: float = 0.9  # chance the validation finds a fault the repair left behind
    nodes_per_rack: int = 0  # > 0: racks are failure domains for the blast-radius breaker
    operator_response: float = 4 * 3600.0  # on-call resets a tripped breaker this long after the trip
    description: str = ""

    def __post_init__(self) -> None:
        _int("gpus", self.gpus, 1)
        _int("gpus_per_node", self.gpus_per_node, 1)
        _pos("days", self.days)
        if isinstance(self.checkpoint_interval, str):
            try:
                object.__setattr__(self, "checkpoint_interval", IntervalRule(self.checkpoint_interval))
            except ValueError:
                raise InvalidInput(
                    "checkpoint_interval", self.checkpoint_interval, "a duration, 'young' or 'daly'"
                ) from None
        else:
            _pos("checkpoint_interval", self.checkpoint_interval)
        for name in ("maintenance_downtime", "checkpoint_write", "checkpoint_persist", "restart_overhead",
                     "restore", "requeue", "warning_lead", "health_check_every", "health_check_cost",
                     "watchdog", "silent_detection", "planned_per_node_day", "operator_response", "revalidation"):
            _nonneg(name, getattr(self, name))
        _int("nodes_per_rack", self.nodes_per_rack, 0)
        if self.hot_spares is not None:
            _int("hot_spares", self.hot_spares, 0)
        for name in ("warning_fraction", "repair_escape", "revalidation_catch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise InvalidInput(name, value, "a fraction in [0, 1]")
        _pos("escape_refail_mean", self.escape_refail_mean)
        if self.health_check_cost > 0 and self.health_check_every <= 0:
            raise InvalidInput("health_check_cost", self.health_check_cost, "0 unless health_check_every is set")
        if self.health_check_every and self.health_check_cost >= self.health_check_every:
            raise InvalidInput("health_check_cost", self.health_check_cost,
                               f"less than the cadence ({self.health_check_every} s)")

    @property
    def nodes(self) -> int:
        """Nodes the job spans."""
        return -(-self.gpus // self.gpus_per_node)

    @property
    def horizon(self) -> float:
        return self.days * DAY

    def unexpected_rate(self) -> float:
        """The job's unexpected failures per second (all categories, nodes in the job only)."""
        return sum(c.per_gpu_hour for c in self.categories) * self.nodes * self.gpus_per_node / 3600.0

    def mtbf(self) -> float:
        rate = self.unexpected_rate()
        return math.inf if rate == 0 else 1.0 / rate

    def interval(self) -> float:
        """The checkpoint interval in seconds (rules resolved)."""
        ci = self.checkpoint_interval
        if isinstance(ci, IntervalRule):
            m = self.mtbf()
            if not math.isfinite(m):
                return self.horizon
            cost = max(self.checkpoint_write, 1e-3)
            f = theory.young_interval if ci is IntervalRule.YOUNG else theory.daly_interval
            return max(1.0, f(cost, m))
        return float(ci)

    def with_(self, **changes: object) -> SimConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def _int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidInput(name, value, f"an integer >= {low}")


def _pos(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
        raise InvalidInput(name, value, "a positive number")


def _nonneg(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
        raise InvalidInput(name, value, "a number >= 0")


def default_categories() -> tuple[FailureCategory, ...]:
    return llama3_categories()
