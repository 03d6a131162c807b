"""The store: every read and write the controller makes, over SQLAlchemy sessions.

Writes that belong together (new events, the decisions they caused, the transitions, the outbox
entries, the audit lines, the node rows) go through :meth:`Store.commit` in ONE transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Executable,
    SQLColumnExpression,
    Table,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.controller.slots import Reference
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import HealthEvent
from gpufleet.domain.inventory import NodeInventory, parse_inventory
from gpufleet.lifecycle.breaker import BreakerState
from gpufleet.lifecycle.decisions import Decision, DecisionStatus
from gpufleet.lifecycle.engine import NodeRecord
from gpufleet.lifecycle.plan import OutboxAction, Plan
from gpufleet.lifecycle.states import NodeState
from gpufleet.lifecycle.ttm import READY_STATES, NodeHistory, Step

from .convert import (
    EVENT_COLUMNS,
    Values,
    audit_values,
    decision_of,
    decision_row,
    event_from,
    event_of,
    event_values,
    outbox_of,
    record_of,
    transition_values,
)
from .keys import chunks, one_of
from .models import (
    ActionRow,
    AuditRow,
    Base,
    CheckpointRow,
    DecisionRow,
    EventRow,
    InventoryRow,
    NodeRow,
    SettingRow,
    TransitionRow,
)

log = logging.getLogger(__name__)

_EXACT_COUNT_UP_TO = 1_000_000  # events: count(*) below, the planner's estimate above (a status page)


class ActionStatus:
    PENDING = "pending"
    WAITING = "waiting"  # e.g. for a job's checkpoint
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    OPEN = (PENDING, WAITING)
    ALL = (PENDING, WAITING, DONE, FAILED, CANCELLED)


EventKey = tuple[str, str]  # (node, id): an event id is unique per reporting node


@dataclass(frozen=True, slots=True)
class Round:
    """What an ingest round writes besides its events: the plan they caused, the node rows it touched."""

    plan: Plan
    nodes: Sequence[NodeRecord]
    merged: Sequence[tuple[str, str, str]] = ()  # (node, id, fault_of): sightings merged onto a fault


@dataclass(frozen=True, slots=True)
class CheckEvent:
    """A stored check result, only what the fleet judge reads (attrs values are strings)."""

    id: str
    node: str
    time: datetime
    attrs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Page:
    limit: int = 100
    offset: int = 0


class IngestRound:
    """One open ingest transaction (see :meth:`Store.round`)."""

    def __init__(self, store: Store, session: Session) -> None:
        self._store, self._s = store, session

    def insert_events(self, events: Sequence[HealthEvent], received: datetime) -> set[EventKey]:
        """Store the events not stored yet; return their (node, id). On SQLite and PostgreSQL the dedup IS
        the insert (``INSERT .. ON CONFLICT (node, id) DO NOTHING RETURNING node, id``); a (node, id)
        repeated within ``events`` is stored once, for its first occurrence."""
        return _insert_new(self._s.connection(), events, received)

    def stored_events(self, keys: Sequence[EventKey]) -> dict[EventKey, HealthEvent]:
        """The stored events of these (node, id) keys, as they arrived (to tell a resend from a reuse)."""
        out: dict[EventKey, HealthEvent] = {}
        wanted = set(keys)
        for chunk in chunks(keys):
            q = select(EventRow).where(EventRow.id.in_([k[1] for k in chunk]),
                                       EventRow.node.in_(sorted({k[0] for k in chunk})))
            for row in self._s.scalars(q):
                if (row.node, row.id) in wanted:
                    out[(row.node, row.id)] = event_of(row)
        return out

    def write(self, r: Round) -> None:
        """The plan the new events caused, the node rows it touched, and merged sightings' ``fault_of``."""
        self._store._write(self._s, r.plan, nodes=r.nodes)
        for node, ident, fault in r.merged:
            self._s.execute(update(EventRow).where(EventRow.node == node, EventRow.id == ident)
                            .values(fault_of=fault))


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.session = sessionmaker(engine, expire_on_commit=False)

    def _one_of(self, column: SQLColumnExpression[str], values: Collection[str]) -> ColumnElement[bool]:
        return one_of(self.engine.dialect.name, column, values)

    # ---- the one write path -----------------------------------------------------------------
    def commit(
        self,
        plan: Plan,
        *,
        events: Sequence[HealthEvent] = (),
        received: datetime | None = None,
        nodes: Iterable[NodeRecord] = (),
        new_nodes: Iterable[tuple[NodeRecord, str, datetime]] = (),
    ) -> None:
        """Persist ``plan`` (and the events and node rows it came from) atomically."""
        with self.session.begin() as s:
            self._write(s, plan, events=events, received=received, nodes=nodes, new_nodes=new_nodes)

    def _write(
        self,
        s: Session,
        plan: Plan,
        *,
        events: Sequence[HealthEvent] = (),
        received: datetime | None = None,
        nodes: Iterable[NodeRecord] = (),
        new_nodes: Iterable[tuple[NodeRecord, str, datetime]] = (),
    ) -> None:
        for rec, rack, when in new_nodes:
            s.add(NodeRow(id=rec.node, rack=rack, domains=sorted(rec.domains), state=rec.state.value,
                          since=rec.since, has_jobs=rec.has_jobs, committed=rec.committed, registered=when))
        if events:
            assert received is not None
            _append(s, EventRow, [event_values(e, received) for e in events])
        for d in plan.decisions:
            s.merge(decision_row(d))
        for did, status in plan.status_changes:
            s.execute(update(DecisionRow).where(DecisionRow.id == did).values(status=status.value))
        _append(s, TransitionRow, [transition_values(t) for t in plan.transitions])
        for a in plan.actions:
            if s.get(ActionRow, a.id) is None:
                s.add(ActionRow(id=a.id, decision_id=a.decision_id, node=a.action.node, kind=a.action.kind.value,
                                reason=a.action.reason, level=a.action.level, status=ActionStatus.PENDING,
                                attempts=0, next_attempt=a.created, last_error="", result="",
                                created=a.created, updated=a.created))
        _append(s, AuditRow, [audit_values(a) for a in plan.audit])
        if plan.breaker is not None:
            b = plan.breaker
            s.merge(SettingRow(key="breaker", value={"tripped": b.tripped, "reason": b.reason,
                                                     "since": b.since.isoformat() if b.since else None}))
        if plan.dry_run is not None:
            s.merge(SettingRow(key="dry_run", value={"on": plan.dry_run}))
        for rec in nodes:
            s.execute(update(NodeRow).where(NodeRow.id == rec.node).values(
                state=rec.state.value, since=rec.since, has_jobs=rec.has_jobs, committed=rec.committed))

    @contextmanager
    def round(self) -> Iterator[IngestRound]:
        """The ingest path's ONE transaction, as a unit of work the caller drives (the store never calls
        back into the domain): :meth:`IngestRound.insert_events` stores the events whose (node, id) are
        new and says which; :meth:`IngestRound.write` adds what they caused. Leaving the block commits;
        an exception anywhere in it rolls the whole round back."""
        with self.session.begin() as s:
            yield IngestRound(self, s)

    def record_heartbeats(self, beats: Sequence[tuple[str, datetime, str]]) -> None:
        """(node, time, agent version) of many heartbeats: one executemany UPDATE, one transaction."""
        if not beats:
            return
        with self.engine.begin() as conn:
            conn.execute(_HEARTBEAT, [{"n": n, "t": t, "v": v} for n, t, v in beats])

    def known_event_ids(self, keys: Sequence[EventKey]) -> set[EventKey]:
        """Which of the (node, id) keys are stored."""
        with self.engine.connect() as conn:
            return _known_ids(conn, keys)

    # ---- inventories ------------------------------------------------------------------------
    def save_inventory(self, inv: NodeInventory, now: datetime, reference: Reference | None = None) -> None:
        """Keep ``inv`` as the node's inventory (replacing the one it registered before), and ``reference``
        as its reference when that is of another document (None: ``inv`` is it, or there is none)."""
        ref = reference.to_json() if reference is not None and reference.inventory != inv else None
        with self.session.begin() as s:
            s.merge(InventoryRow(node=inv.node, doc=inv.to_json(), updated=now, reference=ref))

    def inventory(self, node: str) -> NodeInventory | None:
        with self.session() as s:
            row = s.get(InventoryRow, node)
            return parse_inventory(row.doc) if row is not None else None

    def inventory_registered(self, node: str) -> datetime | None:
        """When the node's agent last registered its inventory (the controller's clock): an agent start."""
        with self.session() as s:
            return s.scalar(select(InventoryRow.updated).where(InventoryRow.node == node))

    def load_inventories(self) -> list[NodeInventory]:
        """Every node's last inventory, least recently registered first (a later report wins)."""
        with self.session() as s:
            rows = s.scalars(select(InventoryRow).order_by(InventoryRow.updated, InventoryRow.node))
            return [parse_inventory(r.doc) for r in rows]

    def load_references(self) -> list[Reference]:
        """The nodes' reference inventories kept beside their last one (``Identity.load`` takes both)."""
        with self.session() as s:
            rows = s.scalars(select(InventoryRow).where(InventoryRow.reference.is_not(None))
                             .order_by(InventoryRow.node))
            out: list[Reference] = []
            for r in rows:
                try:
                    out.append(Reference.from_json(r.reference, "inventories.reference"))
                except InvalidInput as err:  # one unreadable row must not keep the controller from starting
                    log.warning("%s: stored reference inventory not read (%s); the next complete inventory "
                                "is its reference", r.node, err)
            return out

    # ---- loading the engine after a (re)start -----------------------------------------------
    def load_nodes(self) -> list[tuple[NodeRecord, str]]:
        with self.session() as s:
            return [(record_of(r), r.rack) for r in s.scalars(select(NodeRow).order_by(NodeRow.id))]

    def load_held(self, status: DecisionStatus = DecisionStatus.HELD) -> list[Decision]:
        """The decisions held by the breaker (or, with ``status=SUPERSEDED``, those a held group took the
        place of), in the order they were made."""
        with self.session() as s:
            rows = s.scalars(select(DecisionRow).where(DecisionRow.status == status.value)
                             .order_by(DecisionRow.time, DecisionRow.id))
            return [decision_of(r) for r in rows]

    def load_settings(self) -> tuple[BreakerState, bool | None]:
        with self.session() as s:
            b = s.get(SettingRow, "breaker")
            d = s.get(SettingRow, "dry_run")
            breaker = BreakerState()
            if b is not None:
                since = b.value.get("since")
                breaker = BreakerState(bool(b.value.get("tripped")), str(b.value.get("reason", "")),
                                       datetime.fromisoformat(since) if since else None)
            return breaker, (bool(d.value.get("on")) if d is not None else None)

    def events_since(self, since: datetime, kinds: Collection[str] | None = None) -> list[HealthEvent]:
        """Events stamped at or after ``since``, oldest first; only of ``kinds`` when given. Sightings
        merged onto an earlier fault (``fault_of``) are left out: they were never counted."""
        q = select(*EVENT_COLUMNS).where(EventRow.time >= since, EventRow.fault_of.is_(None)).order_by(EventRow.time)
        if kinds is not None:
            q = q.where(EventRow.kind.in_(sorted(kinds)))
        with self.engine.connect() as conn:
            return [event_from(*r) for r in conn.execute(q)]

    def oldest_event_time(self) -> datetime | None:
        """When the oldest stored event was stamped (None: no event): how far back the store reaches."""
        with self.engine.connect() as conn:
            t: datetime | None = conn.execute(select(func.min(EventRow.time))).scalar_one()
            return t

    def events_between(self, since: datetime, until: datetime, *, batch: int = 2000) -> Iterator[HealthEvent]:
        """Events stamped in [``since``, ``until``), oldest first, read ``batch`` rows at a time: the
        correlator's background before its window can be hours of a fleet's events, walked once and
        never held in memory together. Merged sightings are left out, as in :meth:`events_since`; so is a
        row this version cannot read (an event kind it does not know, after a downgrade), with a warning
        that counts them: one bad row must not keep the correlator from being rebuilt."""
        q = (select(*EVENT_COLUMNS).where(EventRow.time >= since, EventRow.time < until, EventRow.fault_of.is_(None))
             .order_by(EventRow.time).execution_options(yield_per=batch))
        unread = 0
        with self.engine.connect() as conn:
            for r in conn.execute(q):
                try:
                    e = event_from(*r)
                except ValueError:
                    unread += 1
                    continue
                yield e
        if unread:
            log.warning("%d stored event(s) from %s to %s could not be read (an event kind this version does not "
                        "know?) and were left out", unread, since.isoformat(), until.isoformat())

    def check_events_since(self, since: datetime, checks: Collection[str], *,
                           exclude_source: str = "") -> list[CheckEvent]:
        """``check_passed`` / ``check_failed`` events stamped at or after ``since`` whose ``attrs.check`` is
        one of ``checks`` (filtered in the database), oldest first, leaving out events of
        ``exclude_source``. Plain columns, no ORM objects: the fleet judge reads a day of a fleet's results."""
        q = (select(EventRow.id, EventRow.node, EventRow.time, EventRow.attrs)
             .where(EventRow.time >= since, EventRow.kind.in_(("check_passed", "check_failed")),
                    EventRow.attrs["check"].as_string().in_(sorted(checks)))
             .order_by(EventRow.time, EventRow.seq))
        if exclude_source:
            q = q.where(EventRow.source != exclude_source)
        with self.engine.connect() as conn:
            return [CheckEvent(i, n, t, {str(k): str(v) for k, v in (a or {}).items()})
                    for i, n, t, a in conn.execute(q)]

    def last_reports(self, node: str, kinds: Collection[str], rules: Collection[str]) -> dict[str, datetime]:
        """Per component of ``node``, when an event of one of ``kinds`` raised by one of ``rules`` was last
        stamped there (filtered and grouped in the database: a busy node's other events do not hide it)."""
        q = (select(EventRow.component, func.max(EventRow.time))
             .where(EventRow.node == node, EventRow.kind.in_(sorted(kinds)),
                    EventRow.attrs["rule"].as_string().in_(sorted(rules)), EventRow.component.is_not(None))
             .group_by(EventRow.component))
        with self.engine.connect() as conn:
            return {str(c): t for c, t in conn.execute(q)}

    def last_entry(self, node: str, into: Collection[str], *, since: datetime | None = None,
                   until: datetime | None = None, from_outside: bool = False, or_actor: str = "") -> datetime | None:
        """When ``node`` last moved into one of the states ``into`` (in ``[since, until]``); with
        ``from_outside``, only from a state not in ``into``, or by ``or_actor``. One aggregate in the
        database: a busy node's thousands of scheduler moves are not read."""
        q = select(func.max(TransitionRow.time)).where(TransitionRow.node == node,
                                                      TransitionRow.to_state.in_(sorted(into)))
        if since is not None:
            q = q.where(TransitionRow.time >= since)
        if until is not None:
            q = q.where(TransitionRow.time <= until)
        if from_outside:
            outside = TransitionRow.from_state.not_in(sorted(into))
            q = q.where(or_(outside, TransitionRow.actor == or_actor) if or_actor else outside)
        with self.engine.connect() as conn:
            t: datetime | None = conn.execute(q).scalar_one()
            return t

    # ---- reads for the API ------------------------------------------------------------------
    def nodes(self, *, state: str | None = None, rack: str | None = None, page: Page = Page(),
              within: Collection[str] | None = None) -> list[NodeRow]:
        """``within`` (here and below): only rows of these nodes (a tenant-scoped caller's)."""
        q = select(NodeRow).order_by(NodeRow.id)
        if within is not None:
            q = q.where(self._one_of(NodeRow.id, within))
        if state:
            q = q.where(NodeRow.state == state)
        if rack:
            q = q.where(NodeRow.rack == rack)
        with self.session() as s:
            return list(s.scalars(q.limit(page.limit).offset(page.offset)))

    def silent_nodes(self, cutoff: datetime, *, skip_states: Sequence[str] = ()) -> list[tuple[str, datetime]]:
        """(node, last heartbeat) of every node last heard from at or before ``cutoff`` (nodes never heard
        from are not silent), leaving out nodes in ``skip_states``. The filter runs in the database: the
        reconciler asks every pass, and a fleet has thousands of nodes."""
        q = (select(NodeRow.id, NodeRow.last_heartbeat)
             .where(NodeRow.last_heartbeat.is_not(None), NodeRow.last_heartbeat <= cutoff,
                    NodeRow.state.not_in(list(skip_states)))
             .order_by(NodeRow.id))
        with self.session() as s:
            return [(node, hb) for node, hb in s.execute(q) if hb is not None]

    def node(self, node: str) -> NodeRow | None:
        with self.session() as s:
            return s.get(NodeRow, node)

    def transitions(self, node: str | None = None, limit: int = 100, *, since: datetime | None = None,
                    until: datetime | None = None) -> list[TransitionRow]:
        q = select(TransitionRow).order_by(TransitionRow.seq.desc()).limit(limit)
        if node:
            q = q.where(TransitionRow.node == node)
        if since:
            q = q.where(TransitionRow.time >= since)
        if until:
            q = q.where(TransitionRow.time < until)
        with self.session() as s:
            return list(s.scalars(q))

    def histories(self) -> list[NodeHistory]:
        """Every node's registration, current state and transitions (oldest first) up to its first ready:
        what time to market is computed from (lifecycle.ttm, which reads no further). Two queries, whatever
        the fleet's size; the second stops at each node's first transition into or out of a ready state
        (a node registered ready leaves one), so a fleet's years of later transitions are not read."""
        ready = [st.value for st in READY_STATES]
        first = (select(TransitionRow.node.label("node"), func.min(TransitionRow.seq).label("seq"))
                 .where(TransitionRow.to_state.in_(ready) | TransitionRow.from_state.in_(ready))
                 .group_by(TransitionRow.node).subquery())
        q = (select(TransitionRow.node, TransitionRow.time, TransitionRow.from_state, TransitionRow.to_state)
             .outerjoin(first, first.c.node == TransitionRow.node)
             .where(first.c.seq.is_(None) | (TransitionRow.seq <= first.c.seq))
             .order_by(TransitionRow.seq))
        with self.session() as s:
            nodes = list(s.execute(select(NodeRow.id, NodeRow.registered, NodeRow.state)))
            steps: dict[str, list[Step]] = {}
            for node, t, a, b in s.execute(q):
                steps.setdefault(node, []).append(Step(t, NodeState(a), NodeState(b)))
        return [NodeHistory(n, reg, NodeState(st), tuple(steps.get(n, ()))) for n, reg, st in nodes]

    def last_transitions(self, *, decided: bool = False) -> dict[str, TransitionRow]:
        """Each node's latest transition (why it is in its state), in one query: the web UI's fleet map.
        ``decided``: the latest one a decision made (its reason names the fault, where a later step of
        the scheduler's, such as "drain complete", does not)."""
        q = select(func.max(TransitionRow.seq)).group_by(TransitionRow.node)
        last = (q.where(TransitionRow.decision_id.is_not(None)) if decided else q).scalar_subquery()
        with self.session() as s:
            return {t.node: t for t in s.scalars(select(TransitionRow).where(TransitionRow.seq.in_(last)))}

    def events(self, *, node: str | None = None, kind: str | None = None, since: datetime | None = None,
               until: datetime | None = None, page: Page = Page(),
               within: Collection[str] | None = None) -> list[EventRow]:
        q = select(EventRow).order_by(EventRow.time.desc(), EventRow.seq.desc())
        if within is not None:
            q = q.where(self._one_of(EventRow.node, within))
        if node:
            q = q.where(EventRow.node == node)
        if kind:
            q = q.where(EventRow.kind == kind)
        if since:
            q = q.where(EventRow.time >= since)
        if until:
            q = q.where(EventRow.time < until)
        with self.session() as s:
            return list(s.scalars(q.limit(page.limit).offset(page.offset)))

    def decisions(
        self, *, node: str | None = None, status: str | None = None, page: Page = Page(),
        within: Collection[str] | None = None,
    ) -> list[DecisionRow]:
        q = select(DecisionRow).order_by(DecisionRow.time.desc(), DecisionRow.id)
        if within is not None:
            q = q.where(self._one_of(DecisionRow.node, within))
        if node:
            q = q.where(DecisionRow.node == node)
        if status:
            q = q.where(DecisionRow.status == status)
        with self.session() as s:
            return list(s.scalars(q.limit(page.limit).offset(page.offset)))

    def actions(self, *, node: str | None = None, status: str | None = None, page: Page = Page(),
                since: datetime | None = None, until: datetime | None = None,
                within: Collection[str] | None = None) -> list[ActionRow]:
        """Outbox actions, newest first; ``since``/``until`` bound the time each was queued."""
        q = select(ActionRow).order_by(ActionRow.created.desc(), ActionRow.id)
        if within is not None:
            q = q.where(self._one_of(ActionRow.node, within))
        if node:
            q = q.where(ActionRow.node == node)
        if status:
            q = q.where(ActionRow.status == status)
        if since:
            q = q.where(ActionRow.created >= since)
        if until:
            q = q.where(ActionRow.created < until)
        with self.session() as s:
            return list(s.scalars(q.limit(page.limit).offset(page.offset)))

    def audit(self, *, target: str | None = None, page: Page = Page(),
              within: Collection[str] | None = None) -> list[AuditRow]:
        q = select(AuditRow).order_by(AuditRow.seq.desc())
        if within is not None:
            q = q.where(self._one_of(AuditRow.target, within))
        if target:
            q = q.where(AuditRow.target == target)
        with self.session() as s:
            return list(s.scalars(q.limit(page.limit).offset(page.offset)))

    def counts(self) -> dict[str, dict[str, int]]:
        with self.session() as s:
            states = {st: n for st, n in s.execute(select(NodeRow.state, func.count()).group_by(NodeRow.state))}
            acts = {st: n for st, n in s.execute(select(ActionRow.status, func.count()).group_by(ActionRow.status))}
            events = self._events_total(s)
        return {"nodes": states, "actions": acts, "events": {"total": events}}

    def node_count(self) -> int:
        """Registered nodes (the readiness probe: one cheap round trip to the database)."""
        with self.session() as s:
            return s.scalar(select(func.count()).select_from(NodeRow)) or 0

    @staticmethod
    def _events_total(s: Session) -> int:
        """Exact on SQLite and on a PostgreSQL table under a million rows; past that, PostgreSQL's own
        estimate (``pg_class.reltuples``, kept by ANALYZE/autovacuum): ``count(*)`` reads the whole table
        (measured in bench/bench_store_plans.py)."""
        if s.get_bind().dialect.name == "postgresql":
            est = s.scalar(text("SELECT reltuples::bigint FROM pg_class WHERE oid = 'events'::regclass"))
            if est is not None and est > _EXACT_COUNT_UP_TO:
                return int(est)
        return s.scalar(select(func.count()).select_from(EventRow)) or 0

    # ---- the outbox -------------------------------------------------------------------------
    def due_actions(self, now: datetime, limit: int = 100) -> list[OutboxAction]:
        """Open actions due at ``now``, oldest first, as typed actions (not rows)."""
        q = (select(ActionRow).where(ActionRow.status.in_(ActionStatus.OPEN), ActionRow.next_attempt <= now)
             .order_by(ActionRow.created, ActionRow.id).limit(limit))
        with self.session() as s:
            return [outbox_of(r) for r in s.scalars(q)]

    def action(self, action_id: str) -> ActionRow | None:
        with self.session() as s:
            return s.get(ActionRow, action_id)

    def decision(self, decision_id: str) -> DecisionRow | None:
        with self.session() as s:
            return s.get(DecisionRow, decision_id)

    def event_kinds(self, node: str, ids: Iterable[str]) -> set[str]:
        """The kinds of ``node``'s events with these ids (a decision's evidence)."""
        wanted = list(ids)
        if not wanted:
            return set()
        with self.session() as s:
            return set(s.scalars(select(EventRow.kind).where(EventRow.node == node, EventRow.id.in_(wanted))))

    def update_action(self, action_id: str, *, status: str, now: datetime, attempts: int | None = None,
                      next_attempt: datetime | None = None, error: str | None = None, result: str | None = None,
                      plan: Plan | None = None, nodes: Iterable[NodeRecord] = (),
                      progress: Mapping[str, str] | None = None) -> None:
        """Record an action's outcome — and the plan it caused — in one transaction. ``progress``
        replaces the action's progress record (what it has done so far)."""
        values: dict[str, object] = {"status": status, "updated": now}
        if progress is not None:
            values["progress"] = dict(progress)
        if attempts is not None:
            values["attempts"] = attempts
        if next_attempt is not None:
            values["next_attempt"] = next_attempt
        if error is not None:
            values["last_error"] = error
        if result is not None:
            values["result"] = result
        with self.session.begin() as s:
            s.execute(update(ActionRow).where(ActionRow.id == action_id).values(**values))
            if plan is not None:
                self._write(s, plan, nodes=nodes)

    def retry_action(self, action_id: str, now: datetime, actor_id: str) -> None:
        with self.session.begin() as s:
            s.execute(update(ActionRow).where(ActionRow.id == action_id).values(
                status=ActionStatus.PENDING, attempts=0, next_attempt=now, updated=now))
            s.add(AuditRow(time=now, actor="operator", actor_id=actor_id, action="retry_action", target=action_id,
                           detail="failed action re-queued"))

    # ---- checkpoints ------------------------------------------------------------------------
    def add_checkpoint(self, job_id: str, time: datetime, received: datetime) -> None:
        """Record ``job_id``'s checkpoint at ``time``. Only each job's latest is ever read, so the
        table keeps one row per job: a newer report replaces it, an older or repeated one is dropped
        (the table grows with jobs, not with checkpoints; ``[retention] events`` prunes old jobs')."""
        with self.session.begin() as s:
            newest = s.scalar(select(func.max(CheckpointRow.time)).where(CheckpointRow.job_id == job_id))
            if newest is not None and newest >= time:
                return
            s.execute(delete(CheckpointRow).where(CheckpointRow.job_id == job_id))
            s.add(CheckpointRow(job_id=job_id, time=time, received=received))

    def prune_checkpoints(self, before: datetime) -> int:
        """Forget the checkpoints received before ``before`` (jobs that have not reported one since:
        long finished, or treated as never having checkpointed); returns how many."""
        with self.session.begin() as s:
            gone = list(s.scalars(delete(CheckpointRow).where(CheckpointRow.received < before)
                                  .returning(CheckpointRow.seq)))
        return len(gone)

    def last_checkpoints(self, job_ids: Sequence[str]) -> dict[str, datetime]:
        """Each job's latest reported checkpoint (jobs that never reported one are left out); any number
        of jobs (a scheduler lists 100,000), :data:`CHUNK` ids a statement."""
        out: dict[str, datetime] = {}
        with self.session() as s:
            for chunk in chunks(list(dict.fromkeys(job_ids))):
                q = (select(CheckpointRow.job_id, func.max(CheckpointRow.time))
                     .where(CheckpointRow.job_id.in_(chunk)).group_by(CheckpointRow.job_id))
                out.update((j, t) for j, t in s.execute(q) if t is not None)
        return out

    def last_checkpoint(self, job_ids: Sequence[str]) -> datetime | None:
        """The latest checkpoint any of these jobs reported (None: none did)."""
        return max(self.last_checkpoints(job_ids).values(), default=None)


def _append(s: Session, model: type[Base], rows: list[Values]) -> None:
    """One Core executemany INSERT into ``model``'s table for append-only rows (no ORM objects)."""
    if rows:
        s.connection().execute(insert(cast(Table, model.__table__)), rows)


_EVENTS = cast(Table, EventRow.__table__)
_NODES = cast(Table, NodeRow.__table__)
_HEARTBEAT = (update(_NODES).where(_NODES.c.id == bindparam("n"))
              .values(last_heartbeat=bindparam("t"), agent_version=bindparam("v")))


_UPSERT: dict[str, Callable[..., Any]] = {"sqlite": sqlite_insert, "postgresql": pg_insert}
_INSERT_NEW: dict[str, Executable] = {}


def _insert_new(conn: Connection, events: Sequence[HealthEvent], received: datetime) -> set[EventKey]:
    """Insert the events not stored yet; return their (node, id)."""
    rows, seen = [], set()
    for e in events:
        if (e.node, e.id) not in seen:
            seen.add((e.node, e.id))
            rows.append(event_values(e, received))
    if not rows:
        return set()
    name = conn.dialect.name
    if name not in _UPSERT or not conn.dialect.insert_executemany_returning:
        # another database, or SQLite before 3.35 (no RETURNING): look first, then insert the rest
        known = _known_ids(conn, [(r["node"], r["id"]) for r in rows])
        rows = [r for r in rows if (r["node"], r["id"]) not in known]
        if rows:
            conn.execute(insert(_EVENTS), rows)
        return {(r["node"], r["id"]) for r in rows}
    stmt = _INSERT_NEW.get(name)
    if stmt is None:
        stmt = _INSERT_NEW[name] = (_UPSERT[name](_EVENTS).on_conflict_do_nothing(index_elements=["node", "id"])
                                    .returning(_EVENTS.c.node, _EVENTS.c.id))
    return {(n, i) for n, i in conn.execute(stmt, rows)}


def _known_ids(conn: Connection, keys: Sequence[EventKey]) -> set[EventKey]:
    found: set[EventKey] = set()
    for chunk in chunks(keys):
        q = select(EventRow.node, EventRow.id).where(
            EventRow.id.in_([k[1] for k in chunk]), EventRow.node.in_(sorted({k[0] for k in chunk})))
        found.update((n, e) for n, e in conn.execute(q) if (n, e) in set(chunk))
    return found
