"""Failure categories and their rates, calibrated to Llama 3's Table 5.

Source: Meta, "The Llama 3 Herd of Models" (arXiv:2407.21783), section 3.3.4 and Table 5: 419
unexpected and 47 planned interruptions of a 16,384-GPU job over a 54-day snapshot. Exposure
16,384 GPUs x 54 d x 24 h = 21,233,664 GPU-hours.

The paper's table is inconsistent: the counts sum to 419 but "Faulty GPU" prints 30.1 % while
148/419 = 35.3 % (the printed share fits about 126 events). **We use the counts** (they sum to the
stated 419 and every other row's share matches count/419); the largest category therefore carries
an uncertainty of about 22 events (~15 %). The low reading is available as
``llama3_categories(faulty_gpu=126)``.

Each category says where it strikes and how it shows itself:

* ``scope``: ``node`` faults hit one node (it is drained and repaired, the job restarts without it);
  ``job`` faults (software bugs, NCCL watchdog timeouts) stop the job but leave its nodes healthy.
* ``detection``: ``immediate`` (the process dies), ``watchdog`` (a hang, noticed by the collective
  watchdog or the next health check, whichever is first), ``silent`` (silent data corruption: noticed
  only by a health check or after ``silent_detection``).
* ``warnable``: faults of this kind can announce themselves (ECC storms, row-remap pending,
  temperature creep, PSU redundancy loss); the configured warning fraction applies to them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind

LLAMA3_GPU_HOURS = 16_384 * 54 * 24
LLAMA3_NODE_DAYS = 2_048 * 54
LLAMA3_PLANNED = 47


class Scope(StrEnum):
    NODE = "node"
    JOB = "job"


class Detection(StrEnum):
    IMMEDIATE = "immediate"
    WATCHDOG = "watchdog"
    SILENT = "silent"


@dataclass(frozen=True, slots=True)
class FailureCategory:
    name: str
    group: str  # Table 5's category column (GPU, Host, Network, Dependency, ...)
    per_gpu_hour: float
    scope: Scope = Scope.NODE
    detection: Detection = Detection.IMMEDIATE
    warnable: bool = False
    # The health event an agent would raise for this fault (what the lifecycle policy sees).
    event: EventKind = EventKind.HEARTBEAT_LOST
    code: int | None = None

    def __post_init__(self) -> None:
        if not self.per_gpu_hour >= 0:
            raise InvalidInput(f"categories.{self.name}.per_gpu_hour", self.per_gpu_hour, "a rate >= 0")


# (name, Table 5 component, group, count, scope, detection, warnable, event kind, code)
_TABLE5: tuple[tuple[str, str, int, Scope, Detection, bool, EventKind, int | None], ...] = (
    ("faulty_gpu", "GPU", 148, Scope.NODE, Detection.IMMEDIATE, True, EventKind.GPU_LOST, 79),
    ("gpu_hbm3", "GPU", 72, Scope.NODE, Detection.IMMEDIATE, True, EventKind.ECC_DBE, 48),
    ("software_bug", "Dependency", 54, Scope.JOB, Detection.IMMEDIATE, False, EventKind.HEARTBEAT_LOST, None),
    ("network", "Network", 35, Scope.NODE, Detection.IMMEDIATE, False, EventKind.LINK_DOWN, None),
    ("host_maintenance", "Unplanned Maintenance", 32, Scope.NODE, Detection.IMMEDIATE, False,
     EventKind.HEARTBEAT_LOST, None),
    ("gpu_sram", "GPU", 19, Scope.NODE, Detection.IMMEDIATE, True, EventKind.XID, 95),
    ("gpu_system_processor", "GPU", 17, Scope.NODE, Detection.IMMEDIATE, False, EventKind.XID, 119),
    ("nic", "Host", 7, Scope.NODE, Detection.IMMEDIATE, False, EventKind.LINK_DOWN, None),
    ("nccl_watchdog", "Unknown", 7, Scope.JOB, Detection.WATCHDOG, False, EventKind.HEARTBEAT_LOST, None),
    ("silent_data_corruption", "GPU", 6, Scope.NODE, Detection.SILENT, False, EventKind.CHECK_FAILED, None),
    ("gpu_thermal", "GPU", 6, Scope.NODE, Detection.IMMEDIATE, True, EventKind.THERMAL, None),
    ("ssd", "Host", 3, Scope.NODE, Detection.IMMEDIATE, True, EventKind.HEARTBEAT_LOST, None),
    ("power_supply", "Host", 3, Scope.NODE, Detection.IMMEDIATE, True, EventKind.HEARTBEAT_LOST, None),
    ("server_chassis", "Host", 2, Scope.NODE, Detection.IMMEDIATE, False, EventKind.HEARTBEAT_LOST, None),
    ("io_expansion_board", "Host", 2, Scope.NODE, Detection.IMMEDIATE, False, EventKind.AER_UNCORRECTED, None),
    ("dependency", "Dependency", 2, Scope.JOB, Detection.IMMEDIATE, False, EventKind.HEARTBEAT_LOST, None),
    ("cpu", "Host", 2, Scope.NODE, Detection.IMMEDIATE, False, EventKind.HEARTBEAT_LOST, None),
    ("system_memory", "Host", 2, Scope.NODE, Detection.IMMEDIATE, False, EventKind.HEARTBEAT_LOST, None),
)

LLAMA3_COUNTS: dict[str, int] = {row[0]: row[2] for row in _TABLE5}


def llama3_categories(*, scale: float = 1.0, faulty_gpu: int | None = None) -> tuple[FailureCategory, ...]:
    """Table 5 as per-GPU-hour Poisson rates (``scale`` multiplies every rate)."""
    if not scale >= 0:
        raise InvalidInput("scale", scale, "a factor >= 0")
    out = []
    for name, group, count, scope, det, warn, kind, code in _TABLE5:
        n = faulty_gpu if (name == "faulty_gpu" and faulty_gpu is not None) else count
        out.append(FailureCategory(name, group, scale * n / LLAMA3_GPU_HOURS, scope, det, warn, kind, code))
    return tuple(out)


def llama3_planned_per_node_day() -> float:
    """Planned interruptions (maintenance, operator actions) per node-day of the job: 47 / 110,592."""
    return LLAMA3_PLANNED / LLAMA3_NODE_DAYS


def uniform_node_rate(failures_per_node_day: float, gpus_per_node: int) -> tuple[FailureCategory, ...]:
    """One fail-stop node category at ``failures_per_node_day`` (Kokolis's r_f), replacing Table 5."""
    if not failures_per_node_day >= 0:
        raise InvalidInput("node_failure_rate", failures_per_node_day, "failures per node-day >= 0")
    per_gpu_hour = failures_per_node_day / 24.0 / gpus_per_node
    return (FailureCategory("node_failure", "Node", per_gpu_hour, Scope.NODE, Detection.IMMEDIATE, True),)


def unexpected_rate_per_s(categories: tuple[FailureCategory, ...], gpus: int) -> float:
    """The job's total unexpected failure rate (per second) for ``gpus`` GPUs."""
    return sum(c.per_gpu_hour for c in categories) * gpus / 3600.0


class FailureMix:
    """All failure categories merged into one Poisson stream over a fleet.

    ``exposed`` node positions carry the node-scope categories (thinned over by the caller), the
    job's ``job_nodes`` the job-scope ones; ``skip_node_scope`` drops node faults (a trace supplies
    them).
    """

    def __init__(self, categories: tuple[FailureCategory, ...], gpus_per_node: int, exposed: int,
                 job_nodes: int, *, skip_node_scope: bool = False) -> None:
        self.categories: list[FailureCategory] = []
        self.cumulative: list[float] = []
        acc = 0.0
        for c in categories:
            if skip_node_scope and c.scope is Scope.NODE:
                continue
            w = c.per_gpu_hour / 3600.0 * gpus_per_node * (exposed if c.scope is Scope.NODE else job_nodes)
            if w > 0:
                acc += w
                self.categories.append(c)
                self.cumulative.append(acc)
        self.rate = acc  # per second

    def pick(self, u: float) -> FailureCategory:
        """The category of an arrival, for ``u`` uniform in [0, 1)."""
        i = bisect.bisect_right(self.cumulative, u * self.rate)
        return self.categories[min(i, len(self.categories) - 1)]
