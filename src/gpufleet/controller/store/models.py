"""SQLAlchemy 2 table models. Schema changes go through Alembic migrations (``migrations/``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpufleet.domain.events import EVENT_ID_MAX, NODE_ID_MAX


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} cannot be stored; use an aware UTC time")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class NodeRow(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    rack: Mapped[str] = mapped_column(String(128), default="")
    domains: Mapped[list[Any]] = mapped_column(default=list)
    state: Mapped[str] = mapped_column(String(32), index=True)
    since: Mapped[datetime]
    has_jobs: Mapped[bool] = mapped_column(Boolean, default=False)
    committed: Mapped[bool] = mapped_column(Boolean, default=False)
    last_heartbeat: Mapped[datetime | None] = mapped_column(default=None)
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    registered: Mapped[datetime]


class EventRow(Base):
    __tablename__ = "events"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(EVENT_ID_MAX))  # the producer's key, unique per node
    node: Mapped[str] = mapped_column(String(NODE_ID_MAX))
    kind: Mapped[str] = mapped_column(String(32))
    time: Mapped[datetime]
    component: Mapped[str | None] = mapped_column(String(200), default=None)
    code: Mapped[int | None] = mapped_column(Integer, default=None)
    severity: Mapped[str | None] = mapped_column(String(16), default=None)
    link: Mapped[str | None] = mapped_column(String(200), default=None)
    message: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(64), default="")
    attrs: Mapped[dict[str, Any]] = mapped_column(default=dict)
    received: Mapped[datetime]
    fault_of: Mapped[str | None] = mapped_column(String(EVENT_ID_MAX), default=None)  # merged onto this id (same node)
    __table_args__ = (Index("ix_events_node_time", "node", "time"),
                      Index("ix_events_time", "time"),  # migration 0010: windows read at start
                      Index("ix_events_kind_time", "kind", "time"),  # migration 0010: one kind's events
                      UniqueConstraint("node", "id", name="uq_events_node_id"))


class InventoryRow(Base):
    """The last ``gpufleet.inventory/v1`` document each node's agent registered, and the node's reference
    (its last complete one, when that is an earlier document; controller/slots.py)."""

    __tablename__ = "inventories"
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    doc: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated: Mapped[datetime]
    reference: Mapped[dict[str, Any] | None] = mapped_column(default=None)  # migration 0014


class DecisionRow(Base):
    __tablename__ = "decisions"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    time: Mapped[datetime]
    from_state: Mapped[str] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    rule: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    severity: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(32))
    actor_id: Mapped[str] = mapped_column(String(128))
    evidence: Mapped[list[Any]] = mapped_column(default=list)
    actions: Mapped[list[Any]] = mapped_column(default=list)
    status: Mapped[str] = mapped_column(String(16), index=True)


class TransitionRow(Base):
    __tablename__ = "transitions"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    from_state: Mapped[str] = mapped_column(String(32))
    to_state: Mapped[str] = mapped_column(String(32))
    time: Mapped[datetime]
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(String(32))
    actor_id: Mapped[str] = mapped_column(String(128))
    evidence: Mapped[list[Any]] = mapped_column(default=list)
    decision_id: Mapped[str | None] = mapped_column(String(64), default=None)
    __table_args__ = (Index("ix_transitions_node_time", "node", "time"),)  # migration 0013: a job's nodes


class ActionRow(Base):
    """The outbox. ``id`` (decision id + kind) is the dedup key; ``status`` walks
    pending -> (waiting ->)* done | failed | cancelled."""

    __tablename__ = "actions"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    decision_id: Mapped[str] = mapped_column(String(64), index=True)
    node: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    level: Mapped[str] = mapped_column(String(16), default="")
    status: Mapped[str] = mapped_column(String(16), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt: Mapped[datetime]
    last_error: Mapped[str] = mapped_column(Text, default="")
    result: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[datetime]
    updated: Mapped[datetime]
    # What a long-running action has done so far (strings only): see migration 0003.
    progress: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    __table_args__ = (Index("ix_actions_node_created", "node", "created"),)  # migration 0013: a job's nodes


class AuditRow(Base):
    __tablename__ = "audit"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[datetime]
    actor: Mapped[str] = mapped_column(String(32))
    actor_id: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(200))
    detail: Mapped[str] = mapped_column(Text)
    __table_args__ = (Index("ix_audit_target_seq", "target", "seq"),)  # migration 0010


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(128), index=True)
    time: Mapped[datetime]
    received: Mapped[datetime]


class SettingRow(Base):
    """Small controller-wide state: the breaker and the dry-run switch."""

    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[dict[str, Any]] = mapped_column(default=dict)


class LeaseRow(Base):
    """A leader lease (``controller.ha``): who holds it, its fencing epoch, until when."""

    __tablename__ = "leader_lease"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(256))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires: Mapped[datetime]
    url: Mapped[str] = mapped_column(String(1024))


class CommandRow(Base):
    """A repair command for a node's agent (migration 0004). ``id`` is the repair step's key."""

    __tablename__ = "commands"
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))  # queued | succeeded | failed | expired
    created: Mapped[datetime]
    updated: Mapped[datetime]
    detail: Mapped[str] = mapped_column(Text, default="")
    __table_args__ = (Index("ix_commands_node_status", "node", "status"),)


class BundleRow(Base):
    """A diagnostic bundle captured when a node entered repair (migration 0006). ``id`` is the capture
    command's key (``<repair action id>:bundle``); ``data`` is the gzip of the bundle's JSON."""

    __tablename__ = "bundles"
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    action_id: Mapped[str] = mapped_column(String(200))
    created: Mapped[datetime]
    size: Mapped[int] = mapped_column(Integer)  # bytes of data (compressed)
    sha256: Mapped[str] = mapped_column(String(64))
    summary: Mapped[str] = mapped_column(Text, default="")  # what it holds and what was skipped
    data: Mapped[bytes] = mapped_column(LargeBinary)
    __table_args__ = (Index("ix_bundles_node", "node"),)


class RepairRow(Base):
    """One repair attempt and its outcome: what the escalation ladder counts (migration 0004)."""

    __tablename__ = "repairs"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(200))
    node: Mapped[str] = mapped_column(String(128))
    time: Mapped[datetime]
    fault: Mapped[str] = mapped_column(String(200))
    step: Mapped[str] = mapped_column(String(32))
    ok: Mapped[bool] = mapped_column(Boolean)
    detail: Mapped[str] = mapped_column(Text, default="")
    __table_args__ = (Index("ix_repairs_node_time", "node", "time"), UniqueConstraint("key", name="uq_repairs_key"))


class GoodputIntervalRow(Base):
    """One final goodput interval a training job reported (migration 0005, ``POST /v1/jobs/{id}/goodput``).
    ``(job_id, run, start)`` is the idempotency key; ``badput`` maps category -> seconds."""

    __tablename__ = "goodput_intervals"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(128))
    run: Mapped[str] = mapped_column(String(128), default="")
    start: Mapped[datetime]
    end: Mapped[datetime]
    productive: Mapped[float] = mapped_column(Float)
    badput: Mapped[dict[str, Any]] = mapped_column(default=dict)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    step_s: Mapped[float] = mapped_column(Float, default=0.0)
    flops: Mapped[float | None] = mapped_column(Float, default=None)
    peak_flops: Mapped[float | None] = mapped_column(Float, default=None)
    world: Mapped[int] = mapped_column(Integer, default=1)
    received: Mapped[datetime]
    __table_args__ = (UniqueConstraint("job_id", "run", "start", name="uq_goodput_job_run_start"),
                      Index("ix_goodput_intervals_end", "end"))


class MaintenanceRow(Base):
    """A maintenance rollout (migration 0007, controller.maintenance): its spec as JSON and its state."""

    __tablename__ = "maintenance_rollouts"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # lifecycle.maintenance.RolloutState
    spec: Mapped[dict[str, Any]] = mapped_column(default=dict)  # lifecycle.maintenance.Spec.as_dict
    actor: Mapped[str] = mapped_column(String(128))  # who planned it (the token's name)
    reason: Mapped[str] = mapped_column(Text, default="")  # why it is stopped, paused, aborted ...
    created: Mapped[datetime]
    updated: Mapped[datetime]


class MaintenanceNodeRow(Base):
    """One node of a rollout and its step (migration 0007). ``command`` is the agent command's key."""

    __tablename__ = "maintenance_nodes"
    rollout: Mapped[str] = mapped_column(String(64), primary_key=True)
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer)  # its place in the rollout's order
    step: Mapped[str] = mapped_column(String(16))  # lifecycle.maintenance.Step
    since: Mapped[datetime]
    detail: Mapped[str] = mapped_column(Text, default="")
    command: Mapped[str] = mapped_column(String(200), default="")
    __table_args__ = (Index("ix_maintenance_nodes_step", "step"),)


class UnitNamingRow(Base):
    """An actionable verdict named the unit ``serial`` at slot ``component`` (migration 0008): the
    correlator's repeat-offender history, which outlives the correlation window and restarts."""

    __tablename__ = "unit_namings"
    serial: Mapped[str] = mapped_column(String(128), primary_key=True)
    time: Mapped[datetime] = mapped_column(primary_key=True)
    component: Mapped[str] = mapped_column(String(256), primary_key=True)
    kind: Mapped[str] = mapped_column(String(64))


class NodeTenantRow(Base):
    """Who owns a node since its last move (migration 0009, docs/tenancy.md): ``tenant`` is NULL while a
    move runs and after one failed (no tenant sees it). A node without a row belongs to its configured pool."""

    __tablename__ = "node_tenants"
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    tenant: Mapped[str | None] = mapped_column(String(64), nullable=True)
    since: Mapped[datetime]
    move: Mapped[str] = mapped_column(String(64))  # the move that set it


class TenancyMoveRow(Base):
    """A move of a node to another tenant and its reprovision (migration 0009, controller.reprovision).
    ``rollout`` is the maintenance rollout that drains, wipes and validates the node."""

    __tablename__ = "tenancy_moves"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    from_tenant: Mapped[str | None] = mapped_column(String(64), nullable=True)
    to_tenant: Mapped[str] = mapped_column(String(64))
    rollout: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # running | done | failed
    detail: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(128))
    created: Mapped[datetime]
    updated: Mapped[datetime]
    __table_args__ = (Index("ix_tenancy_moves_node", "node"), Index("ix_tenancy_moves_state", "state"))


class SpareRow(Base):
    """A node's role in a hot-spare pool (migration 0011, controller.spares). A pool node without a row
    is a working node of the big partition. ``replaces``: the failed node a reclaimed spare stands in for;
    ``step``: how far a reclaim got (backfill_left, requeued, joined), so a restarted controller resumes."""

    __tablename__ = "spare_nodes"
    node: Mapped[str] = mapped_column(String(128), primary_key=True)
    pool: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))  # lifecycle.spares.Role
    replaces: Mapped[str] = mapped_column(String(128), default="")
    step: Mapped[str] = mapped_column(String(32), default="")
    since: Mapped[datetime]
    detail: Mapped[str] = mapped_column(Text, default="")
    __table_args__ = (Index("ix_spare_nodes_pool", "pool"),)
