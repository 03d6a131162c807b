"""Maintenance rollouts in the store (tables ``maintenance_rollouts`` and ``maintenance_nodes``, migration 0007).

Every change of a rollout's state or of a node's step is written in ONE transaction with its audit line
(the ``audit`` table every other decision goes to), so the audit log and the rollout never disagree,
even across a crash.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.domain.errors import Conflict, NotFound
from gpufleet.lifecycle.maintenance import ACTIVE, FINISHED, IN_FLIGHT, RolloutState, Spec, Step
from gpufleet.lifecycle.plan import AuditEntry

from .convert import audit_values
from .keys import one_of
from .models import AuditRow, MaintenanceNodeRow, MaintenanceRow
from .repo import Store


@dataclass(frozen=True, slots=True)
class NodeStep:
    node: str
    seq: int
    step: Step
    since: datetime
    detail: str = ""
    command: str = ""  # the agent command's key, once the action was queued


@dataclass(frozen=True, slots=True)
class RolloutHead:
    """What a rollout is, without its nodes."""

    id: str
    state: RolloutState
    spec: Spec
    actor: str
    reason: str
    created: datetime
    updated: datetime


@dataclass(frozen=True, slots=True)
class Rollout(RolloutHead):
    nodes: tuple[NodeStep, ...]

    def node(self, name: str) -> NodeStep:
        for n in self.nodes:
            if n.node == name:
                return n
        raise NotFound(f"node of rollout {self.id}", name)

    def at(self, *steps: Step) -> list[NodeStep]:
        return [n for n in self.nodes if n.step in steps]


@dataclass(frozen=True, slots=True)
class RolloutSummary(RolloutHead):
    """A rollout without its nodes: how many are at each step (the list of rollouts)."""

    counts: dict[str, int]


def _rollout(r: MaintenanceRow, nodes: Sequence[MaintenanceNodeRow]) -> Rollout:
    return Rollout(r.id, RolloutState(r.state), Spec.of_dict(r.spec), r.actor, r.reason, r.created, r.updated,
                   tuple(NodeStep(n.node, n.seq, Step(n.step), n.since, n.detail, n.command)
                         for n in sorted(nodes, key=lambda n: n.seq)))


class MaintenanceStore:
    def __init__(self, store: Store) -> None:
        self.session = store.session

    def create(self, rid: str, spec: Spec, nodes: Sequence[str], actor: str, now: datetime,
               audit: AuditEntry) -> Rollout:
        with self.session.begin() as s:
            if s.get(MaintenanceRow, rid) is not None:
                raise Conflict(f"maintenance rollout {rid} exists already")
            s.add(MaintenanceRow(id=rid, state=RolloutState.PLANNED.value, spec=spec.as_dict(), actor=actor,
                                 reason="", created=now, updated=now))
            for i, n in enumerate(nodes):
                s.add(MaintenanceNodeRow(rollout=rid, node=n, seq=i, step=Step.PENDING.value, since=now,
                                         detail="", command=""))
            s.add(AuditRow(**audit_values(audit)))
        return self.get(rid)

    def summaries(self, *, limit: int = 100, within: Collection[str] | None = None) -> list[RolloutSummary]:
        """The newest ``limit`` rollouts with their nodes counted per step, not listed (a rollout of the
        whole fleet has 20,000); ``within``: only rollouts all of whose nodes are in it (a tenant's)."""
        m, n = MaintenanceRow, MaintenanceNodeRow
        with self.session() as s:
            rows = list(s.scalars(select(m).order_by(m.created.desc(), m.id).limit(limit)))
            ids = [r.id for r in rows]  # at most limit: a plain IN
            counts: dict[str, dict[str, int]] = {}
            for rid, step, count in s.execute(select(n.rollout, n.step, func.count()).where(n.rollout.in_(ids))
                                              .group_by(n.rollout, n.step)):
                counts.setdefault(rid, {})[step] = count
            hidden: set[str] = set()
            if within is not None and ids:
                outside = ~one_of(s.get_bind().dialect.name, n.node, within)
                hidden = set(s.scalars(select(n.rollout).where(n.rollout.in_(ids), outside).distinct()))
        return [RolloutSummary(r.id, RolloutState(r.state), Spec.of_dict(r.spec), r.actor, r.reason, r.created,
                               r.updated, counts.get(r.id, {})) for r in rows if r.id not in hidden]

    def get(self, rid: str) -> Rollout:
        with self.session() as s:
            r = s.get(MaintenanceRow, rid)
            if r is None:
                raise NotFound("maintenance rollout", rid)
            return _rollout(r, list(s.scalars(select(MaintenanceNodeRow).where(MaintenanceNodeRow.rollout == rid))))

    def list(self, *, active_only: bool = False, limit: int = 100) -> list[Rollout]:
        q = select(MaintenanceRow).order_by(MaintenanceRow.created.desc(), MaintenanceRow.id).limit(limit)
        if active_only:
            q = q.where(MaintenanceRow.state.in_([s.value for s in ACTIVE]))
        with self.session() as s:
            rows = list(s.scalars(q))
            nodes = list(s.scalars(select(MaintenanceNodeRow).where(
                MaintenanceNodeRow.rollout.in_([r.id for r in rows])))) if rows else []
        by: dict[str, list[MaintenanceNodeRow]] = {}
        for n in nodes:
            by.setdefault(n.rollout, []).append(n)
        return [_rollout(r, by.get(r.id, [])) for r in rows]

    def held_nodes(self) -> set[str]:
        """Nodes a rollout has in flight (draining, action, validating): the time-driven rules skip them."""
        q = select(MaintenanceNodeRow.node).where(MaintenanceNodeRow.step.in_([s.value for s in IN_FLIGHT]))
        with self.session() as s:
            return set(s.scalars(q))

    def set_state(self, rid: str, state: RolloutState, reason: str, now: datetime, audit: AuditEntry, *,
                  expect: Sequence[RolloutState] = ()) -> Rollout:
        """Move the rollout to ``state``; Conflict when it is not in one of ``expect`` (when given)."""
        with self.session.begin() as s:
            r = s.get(MaintenanceRow, rid, with_for_update=True)
            if r is None:
                raise NotFound("maintenance rollout", rid)
            if expect and RolloutState(r.state) not in expect:
                raise Conflict(f"maintenance rollout {rid} is {r.state}: this applies to a rollout that is "
                               f"{' or '.join(e.value for e in expect)}")
            r.state, r.reason, r.updated = state.value, reason[:2000], now
            s.add(AuditRow(**audit_values(audit)))
        return self.get(rid)

    def set_step(self, rid: str, node: str, step: Step, detail: str, now: datetime, audit: AuditEntry | None, *,
                 command: str | None = None) -> None:
        """Record ``node``'s new step (and its audit line) — a no-op for a node already finished."""
        with self.session.begin() as s:
            self._step(s, rid, node, step, detail, now, audit, command)

    def skip_pending(self, rid: str, detail: str, now: datetime, audit: AuditEntry) -> int:
        """Every pending node of the rollout -> skipped (an abort); returns how many."""
        with self.session.begin() as s:
            rows = list(s.scalars(select(MaintenanceNodeRow).where(
                MaintenanceNodeRow.rollout == rid, MaintenanceNodeRow.step == Step.PENDING.value)))
            for r in rows:
                r.step, r.since, r.detail = Step.SKIPPED.value, now, detail
            s.add(AuditRow(**audit_values(audit)))
            return len(rows)

    @staticmethod
    def _step(s: Session, rid: str, node: str, step: Step, detail: str, now: datetime, audit: AuditEntry | None,
              command: str | None) -> None:
        r = s.get(MaintenanceNodeRow, (rid, node), with_for_update=True)
        if r is None:
            raise NotFound(f"node of rollout {rid}", node)
        if Step(r.step) in FINISHED:
            return
        if Step(r.step) != step:
            r.since = now  # (a step's timeout counts from when it began, not from its last detail)
        r.step, r.detail = step.value, detail[:2000]
        if command is not None:
            r.command = command
        if audit is not None:
            s.add(AuditRow(**audit_values(audit)))
