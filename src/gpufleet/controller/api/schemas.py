"""API bodies (pydantic, ``extra="forbid"``): the edge where JSON becomes domain values."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Query
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    model_validator,
)

from gpufleet.domain.events import EVENT_ID_MAX, NODE_ID_MAX, EventKind, HealthEvent, Severity
from gpufleet.domain.text import NAME_MAX, REF_MAX, TEXT_EXPECTED, unstorable
from gpufleet.lifecycle.states import NodeState


def _aware(v: datetime) -> datetime:
    if v.tzinfo is None:
        raise ValueError("time must include a timezone, e.g. 2026-11-21T12:00:00Z")
    # Normalised to the one stdlib UTC object: pydantic gives every parsed time its own tzinfo object,
    # which the controller would otherwise keep alive (and scan in every GC pass) for each event.
    try:
        return v.astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31T23:00:00-05:00 is in the year 10000 in UTC
        raise ValueError("a time between years 1 and 9999 in UTC") from None


def _iso_text(v: object) -> object:
    """A time is ISO-8601 text (or already a datetime): a bare number is refused, not read as Unix time
    (an agent sending epoch seconds had its events stored in 1970 and judged stale, silently)."""
    if isinstance(v, str | datetime):
        return v
    raise ValueError("an ISO-8601 time with a zone as a string, e.g. 2026-11-21T12:00:00Z, not a number")


AwareTime = Annotated[datetime, BeforeValidator(_iso_text), AfterValidator(_aware)]


def _storable(v: str) -> str:
    if unstorable(v):
        raise ValueError(TEXT_EXPECTED)
    return v


# Every text field of every body and parameter (domain/text.py): refused here if no database could
# store it, so one bad batch is a 422 for its sender instead of a failed write for every batch grouped
# with it. Each field also has the length of the column it lands in.
Text = Annotated[str, AfterValidator(_storable)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX), AfterValidator(_storable)]
Ref = Annotated[str, StringConstraints(max_length=REF_MAX), AfterValidator(_storable)]
Limit = Annotated[int, Query(ge=1, le=1000)]  # a listing's page: ?limit= (default 100 where not said)
MAX_OFFSET = 2**31 - 1  # both databases take a 64-bit OFFSET; no listing is anywhere near this long
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
MAX_CODE = 2**31 - 1  # the events.code column is a 32-bit integer on PostgreSQL


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EventIn(_In):
    id: Text = Field(min_length=1, max_length=EVENT_ID_MAX, description="the producer's idempotency key")
    node: Text = Field(min_length=1, max_length=NODE_ID_MAX)
    kind: EventKind
    time: AwareTime
    component: Text | None = Field(default=None, max_length=200)
    code: int | None = Field(default=None, ge=0, le=MAX_CODE, strict=True)
    severity: Severity | None = Field(default=None, description="only what the source stated; the controller judges")
    link: Text | None = Field(default=None, max_length=200)
    message: Text = Field(default="", max_length=4000)
    source: Text = Field(default="agent", max_length=64)
    attrs: dict[Text, Text] = Field(default_factory=dict)

    def to_domain(self) -> HealthEvent:
        return HealthEvent(id=self.id, node=self.node, kind=self.kind, time=self.time, component=self.component,
                           code=self.code, severity=self.severity, link=self.link, message=self.message,
                           source=self.source, attrs=tuple(sorted(self.attrs.items())))

    @classmethod
    def of(cls, e: HealthEvent) -> EventIn:
        """The wire form of an event the controller made itself (e.g. ``moved``), as an agent sends one."""
        return cls(id=e.id, node=e.node, kind=e.kind, time=e.time, component=e.component, code=e.code,
                   severity=e.severity, link=e.link, message=e.message, source=e.source, attrs=dict(e.attrs))


class EventBatch(_In):
    events: list[EventIn] = Field(min_length=1, max_length=10_000)


class InventoryOut(BaseModel):
    moved: list[EventIn] = Field(description="the moves this inventory showed (serial at a new slot)")
    missing: list[EventIn] = Field(default_factory=list, description="the units of the node's reference "
                                   "inventory this one lacks (gpu_lost, check_failed: docs/formats.md, Identities)")


class IngestOut(BaseModel):
    accepted: int
    duplicates: int
    decisions: int


class HeartbeatIn(_In):
    time: AwareTime
    agent_version: Text = Field(default="", max_length=64)


class GpuIn(_In):
    index: int = Field(ge=0, le=MAX_CODE)
    serial: Ref = ""
    pci: Ref = ""
    sku: Ref = "H100-SXM"


class NodeIn(_In):
    id: str = Field(min_length=1, max_length=NAME_MAX, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    rack: Name
    serial: Ref = ""
    leaves: list[Ref] = Field(default_factory=list, max_length=1024, description="leaf switches its NICs land on")
    gpus: list[GpuIn] = Field(default_factory=list, max_length=1024)


class RegisterIn(_In):
    nodes: list[NodeIn] = Field(min_length=1, max_length=10_000)
    state: NodeState = Field(default=NodeState.NEW, description="new (burn-in first) or ready (adopt as is)")


class ReasonIn(_In):
    reason: Text = Field(default="", max_length=500)


class BreakerResetIn(_In):
    # JSON true/false only: "no" or 1 for a fleet-wide switch is a typo, not a choice (a drill had "yes" turn
    # dry-run on).
    discard_held: StrictBool = Field(default=False,
                                     description="cancel the held decisions instead of re-admitting them")


class ApproveIn(_In):
    nodes: list[Name] = Field(default_factory=list, max_length=10_000)
    component: Ref = Field(default="", description="approve every node held for this correlated component")

    @model_validator(mode="after")
    def _one(self) -> ApproveIn:
        if bool(self.nodes) == bool(self.component):
            raise ValueError("give either nodes or component")
        return self


class ModeIn(_In):
    dry_run: StrictBool


class CheckpointIn(_In):
    time: AwareTime


MAX_INTERVALS = 1000  # per goodput post; the sender splits a longer backlog
_SECONDS = Field(default=0.0, ge=0, le=1e9, allow_inf_nan=False)


class BadputIn(_In):
    """Seconds by category (docs/goodput.md); a category left out is 0."""

    startup: float = _SECONDS
    checkpoint_save: float = _SECONDS
    checkpoint_restore: float = _SECONDS
    lost_progress: float = _SECONDS
    detection: float = _SECONDS
    waiting: float = _SECONDS
    planned_maintenance: float = _SECONDS
    health_check: float = _SECONDS
    data_wait: float = _SECONDS


class GoodputIntervalIn(_In):
    start: AwareTime
    end: AwareTime
    productive_s: float = Field(ge=0, le=1e9, allow_inf_nan=False)
    badput_s: BadputIn = Field(default_factory=BadputIn)
    steps: int = Field(default=0, ge=0, le=MAX_CODE, strict=True)
    step_s: float = Field(default=0.0, ge=0, le=1e9, allow_inf_nan=False)
    flops: float | None = Field(default=None, ge=0, le=1e30, allow_inf_nan=False,
                                description="model FLOPs of the steps completed in the interval (per rank)")
    peak_flops: float | None = Field(default=None, gt=0, le=1e18, allow_inf_nan=False,
                                     description="the device's peak FLOP/s (per rank)")

    @model_validator(mode="after")
    def _consistent(self) -> GoodputIntervalIn:
        length = (self.end - self.start).total_seconds()
        if length <= 0:
            raise ValueError("end must be after start")
        counted = self.productive_s + sum(self.badput_s.model_dump().values())
        if abs(counted - length) > max(1e-3, 1e-6 * length):
            raise ValueError(f"productive_s + badput_s ({counted:.6g} s) must equal end - start ({length:.6g} s)")
        return self


class GoodputIn(_In):
    run: Text = Field(default="", max_length=NAME_MAX,
                      description="the run within the job (e.g. its run directory name)")
    world: int = Field(default=1, ge=1, le=1_000_000, strict=True, description="ranks (GPUs) of the run")
    intervals: list[GoodputIntervalIn] = Field(min_length=1, max_length=MAX_INTERVALS)
