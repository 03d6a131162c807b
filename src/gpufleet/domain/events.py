"""Health events: the one currency every observer (agent, checks, diagnose, correlate) pays in.

The interchange form is ``gpufleet.event/v1`` (docs/formats.md); inside the process an event is a
frozen :class:`HealthEvent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet.domain.judgement import Judgement


class EventKind(StrEnum):
    XID = "xid"
    SXID = "sxid"
    LINK_ERROR = "link_error"
    LINK_DOWN = "link_down"
    LINK_FLAP = "link_flap"
    ECC_SBE = "ecc_sbe"
    ECC_DBE = "ecc_dbe"
    ROW_REMAP_PENDING = "row_remap_pending"
    ROW_REMAP_FAILURE = "row_remap_failure"
    THERMAL = "thermal"
    AER_CORRECTED = "aer_corrected"
    AER_UNCORRECTED = "aer_uncorrected"
    CHECK_FAILED = "check_failed"
    MOVED = "moved"
    # Extensions beyond the DESIGN.md list, needed by the lifecycle:
    CHECK_PASSED = "check_passed"  # an active validation passed (revalidate -> ready, burn-in done)
    GPU_LOST = "gpu_lost"  # GPU fell off the bus / not visible to the driver (XID 79 class)
    HEARTBEAT_LOST = "heartbeat_lost"  # the node's agent stopped reporting
    GPU_IDLE = "gpu_idle"  # a GPU allocated to a job sat idle past a threshold (usage, not a fault)


class Severity(StrEnum):
    """How bad an event is for the node that reported it.

    fatal: the node cannot run work correctly -> drain now.
    degraded: the node works but is at risk -> suspect; drain at the running job's next checkpoint.
    info: recorded, no lifecycle effect on its own (may count towards an escalation).
    """

    FATAL = "fatal"
    DEGRADED = "degraded"
    INFO = "info"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


# The longest event id and node name the controller takes (API and database: one limit, here).
EVENT_ID_MAX = 200
NODE_ID_MAX = 128

_SEVERITY_RANK = {Severity.INFO: 0, Severity.DEGRADED: 1, Severity.FATAL: 2}

# Link events (InfiniBand ports, NVLink links): held for the correlator (controller.admission) and,
# as a repair's cause, what makes a fault a fabric fault (lifecycle.validation).
LINK_KINDS = frozenset({EventKind.LINK_DOWN, EventKind.LINK_FLAP, EventKind.LINK_ERROR})
# The agent's weak link reports (agent/weaklinks.py; decision 0127): error-counter growth below its threshold
# rules, judged info. Witnesses for the correlator only: no per-node escalation counts them (50 corrected
# errors spread over a node's links in ten minutes are not 50 bad links).
NVLINK_SEEN, IB_SYMBOL_SEEN, IB_RCV_SEEN = "nvlink_error_seen", "ib_symbol_error_seen", "ib_port_rcv_error_seen"
WEAK_REPORT_RULES = frozenset({NVLINK_SEEN, IB_SYMBOL_SEEN, IB_RCV_SEEN})


def worst(severities: list[Severity]) -> Severity:
    """The most severe of ``severities`` (INFO for an empty list)."""
    return max(severities, key=lambda s: s.rank, default=Severity.INFO)


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """One observation about one node.

    ``id`` is the producer's idempotency key, unique per reporting node (agents resend after a
    timeout; the store keeps the first copy). ``severity`` is only what the *source itself stated*
    (a kernel line's ``Fatal`` word, a failed check that found wrong answers), usually None: it is
    never a catalog judgement. ``attrs.rule`` names the agent rule that raised it. The controller
    judges every event once (:func:`gpufleet.domain.judgement.judge`) and attaches the result as
    ``judgement``, which every consumer (policy, correlation, metrics) reads.
    """

    id: str
    node: str
    kind: EventKind
    time: datetime
    component: str | None = None
    code: int | None = None
    severity: Severity | None = None
    link: str | None = None
    message: str = ""
    source: str = "agent"
    attrs: tuple[tuple[str, str], ...] = field(default=())
    judgement: Judgement | None = field(default=None, compare=False)

    def attr(self, key: str, default: str = "") -> str:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def __post_init__(self) -> None:
        if self.time.tzinfo is None:
            raise ValueError(f"time: got naive datetime {self.time!r}, expected a timezone-aware time")


def utc(dt: datetime) -> datetime:
    """``dt`` as an aware UTC datetime (naive input is taken to be UTC)."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
