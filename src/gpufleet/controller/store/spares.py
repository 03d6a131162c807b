"""Hot-spare pools in the store (table ``spare_nodes``, migration 0011).

Each change of a node's role or of a reclaim's step is written in ONE transaction with its audit line,
so the audit log and the pools never disagree, even across a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from gpufleet.lifecycle.plan import AuditEntry
from gpufleet.lifecycle.spares import Held, Role

from .convert import audit_values
from .models import AuditRow, SpareRow
from .repo import Store


@dataclass(frozen=True, slots=True)
class SpareNode:
    node: str
    pool: str
    role: Role
    replaces: str
    step: str  # a reclaim's last step done ("" before the first)
    since: datetime
    detail: str

    @property
    def held(self) -> Held:
        return Held(self.role, self.replaces)


def _of(r: SpareRow) -> SpareNode:
    return SpareNode(r.node, r.pool, Role(r.role), r.replaces, r.step, r.since, r.detail)


class SpareStore:
    def __init__(self, store: Store) -> None:
        self.session = store.session

    def all(self) -> list[SpareNode]:
        with self.session() as s:
            return [_of(r) for r in s.scalars(select(SpareRow).order_by(SpareRow.pool, SpareRow.node))]

    def get(self, node: str) -> SpareNode | None:
        with self.session() as s:
            r = s.get(SpareRow, node)
            return _of(r) if r is not None else None

    def put(self, node: str, pool: str, role: Role, now: datetime, audit: AuditEntry | None, *, replaces: str = "",
            step: str = "", detail: str = "") -> None:
        """Give ``node`` its role in ``pool`` (a new row, or the row changed) with its audit line."""
        with self.session.begin() as s:
            r = s.get(SpareRow, node, with_for_update=True)
            if r is None:
                r = SpareRow(node=node, pool=pool, role=role.value, replaces=replaces, step=step, since=now,
                             detail=detail[:2000])
                s.add(r)
            else:
                if r.role != role.value:
                    r.since = now
                r.pool, r.role, r.replaces, r.step, r.detail = pool, role.value, replaces, step, detail[:2000]
            if audit is not None:
                s.add(AuditRow(**audit_values(audit)))

    def drop(self, node: str, audit: AuditEntry) -> None:
        """``node`` is a working node again (no role), with its audit line; a no-op for a node without one."""
        with self.session.begin() as s:
            r = s.get(SpareRow, node, with_for_update=True)
            if r is None:
                return
            s.delete(r)
            s.add(AuditRow(**audit_values(audit)))

    def audit(self, audit: AuditEntry) -> None:
        """An audit line of its own (a partition's membership set again)."""
        with self.session.begin() as s:
            s.add(AuditRow(**audit_values(audit)))
