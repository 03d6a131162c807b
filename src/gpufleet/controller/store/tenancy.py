"""Node ownership and tenancy moves in the store (tables ``node_tenants`` and ``tenancy_moves``, migration 0009).

Every change is written in ONE transaction with its audit line, so the audit log, the move and the
owner never disagree, even across a crash. The owner is released (NULL: no tenant) in the same
transaction that records the move, and set to the new tenant only in the one that completes it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.domain.errors import Conflict, NotFound
from gpufleet.lifecycle.plan import AuditEntry

from .convert import audit_values
from .keys import one_of
from .models import AuditRow, NodeTenantRow, TenancyMoveRow
from .repo import Store

RUNNING, DONE, FAILED = "running", "done", "failed"


@dataclass(frozen=True, slots=True)
class Move:
    id: str
    node: str
    from_tenant: str | None
    to_tenant: str
    rollout: str  # the maintenance rollout that drains, wipes and validates the node
    state: str  # running | done | failed
    detail: str
    actor: str
    created: datetime
    updated: datetime


def being_moved(node: str, move_id: str) -> Conflict:
    """The refusal of a move of ``node`` while its move ``move_id`` runs."""
    return Conflict(f"node {node} is being moved already ({move_id}): wait for it to finish")


def _move(r: TenancyMoveRow) -> Move:
    return Move(r.id, r.node, r.from_tenant, r.to_tenant, r.rollout, r.state, r.detail, r.actor, r.created, r.updated)


class TenancyStore:
    def __init__(self, store: Store) -> None:
        self.session = store.session
        self._dialect = store.engine.dialect.name

    def owners(self) -> dict[str, str | None]:
        """The recorded owner of every node that was ever moved (None: no tenant)."""
        with self.session() as s:
            return {n: t for n, t in s.execute(select(NodeTenantRow.node, NodeTenantRow.tenant))}

    def begin(self, move: Move, audit: AuditEntry) -> Move:
        """Record ``move`` and release the node (no tenant) — Conflict while another move of it runs."""
        with self.session.begin() as s:
            running = s.scalar(select(TenancyMoveRow.id).where(TenancyMoveRow.node == move.node,
                                                               TenancyMoveRow.state == RUNNING))
            if running is not None:
                raise being_moved(move.node, running)
            s.add(TenancyMoveRow(id=move.id, node=move.node, from_tenant=move.from_tenant, to_tenant=move.to_tenant,
                                 rollout=move.rollout, state=RUNNING, detail=move.detail[:2000], actor=move.actor,
                                 created=move.created, updated=move.updated))
            self._own(s, move.node, None, move.created, move.id)
            s.add(AuditRow(**audit_values(audit)))
        return self.get(move.id)

    def finish(self, move_id: str, ok: bool, detail: str, now: datetime, audit: AuditEntry) -> bool:
        """Complete a running move: ``ok`` hands the node to its new tenant, else it stays without one.
        False (nothing written) when the move is not running any more (a second call after a crash)."""
        with self.session.begin() as s:
            r = s.get(TenancyMoveRow, move_id, with_for_update=True)
            if r is None:
                raise NotFound("tenancy move", move_id)
            if r.state != RUNNING:
                return False
            r.state, r.detail, r.updated = (DONE if ok else FAILED), detail[:2000], now
            self._own(s, r.node, r.to_tenant if ok else None, now, r.id)
            s.add(AuditRow(**audit_values(audit)))
            return True

    def note(self, move_id: str, detail: str, now: datetime) -> None:
        with self.session.begin() as s:
            r = s.get(TenancyMoveRow, move_id, with_for_update=True)
            if r is not None and r.state == RUNNING:
                r.detail, r.updated = detail[:2000], now

    def get(self, move_id: str) -> Move:
        with self.session() as s:
            r = s.get(TenancyMoveRow, move_id)
            if r is None:
                raise NotFound("tenancy move", move_id)
            return _move(r)

    def moves(self, *, running_only: bool = False, nodes: Collection[str] | None = None,
              limit: int = 100) -> list[Move]:
        """Moves, newest first (``nodes``: of these nodes only)."""
        q = select(TenancyMoveRow).order_by(TenancyMoveRow.created.desc(), TenancyMoveRow.id.desc()).limit(limit)
        if running_only:
            q = q.where(TenancyMoveRow.state == RUNNING)
        if nodes is not None:
            q = q.where(one_of(self._dialect, TenancyMoveRow.node, nodes))  # a tenant's nodes: up to the fleet
        with self.session() as s:
            return [_move(r) for r in s.scalars(q)]

    @staticmethod
    def _own(s: Session, node: str, tenant: str | None, now: datetime, move: str) -> None:
        row = s.get(NodeTenantRow, node, with_for_update=True)
        if row is None:
            s.add(NodeTenantRow(node=node, tenant=tenant, since=now, move=move))
        else:
            row.tenant, row.since, row.move = tenant, now, move
