"""The repair log and the agent command queue (tables ``repairs`` and ``commands``, migration 0004).

Both are keyed by the repair step's key (``<outbox action id>:<attempt>:<step>``), so every write here
is idempotent: a controller that crashed after queueing a command or recording an attempt and does it
again after its restart changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from gpufleet.domain.errors import Conflict, NotFound
from gpufleet.domain.events import HealthEvent
from gpufleet.lifecycle.repair import RepairAttempt, RepairStep

from .convert import event_of
from .models import CommandRow, EventRow, RepairRow
from .repo import Store


class CommandStatus:
    QUEUED = "queued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"  # no result within the step timeout: the agent must not run it any more


@dataclass(frozen=True, slots=True)
class Command:
    id: str
    node: str
    kind: str
    status: str
    created: datetime
    detail: str = ""


def _command(r: CommandRow) -> Command:
    return Command(r.id, r.node, r.kind, r.status, r.created, r.detail)


class RepairStore:
    def __init__(self, store: Store) -> None:
        self.session = store.session

    # ---- commands for agents ----------------------------------------------------------------
    def enqueue(self, key: str, node: str, kind: str, now: datetime) -> None:
        """Queue ``kind`` for ``node``'s agent under ``key`` (a no-op when ``key`` exists)."""
        with self.session.begin() as s:
            if s.get(CommandRow, key) is None:
                s.add(CommandRow(id=key, node=node, kind=str(kind), status=CommandStatus.QUEUED, created=now,
                                 updated=now, detail=""))

    def pending(self, node: str) -> list[Command]:
        """The commands ``node``'s agent has still to run, oldest first."""
        q = (select(CommandRow).where(CommandRow.node == node, CommandRow.status == CommandStatus.QUEUED)
             .order_by(CommandRow.created, CommandRow.id))
        with self.session() as s:
            return [_command(r) for r in s.scalars(q)]

    def command(self, key: str) -> Command | None:
        with self.session() as s:
            r = s.get(CommandRow, key)
            return None if r is None else _command(r)

    def finish(self, node: str, key: str, ok: bool, detail: str, now: datetime) -> Command:
        """The agent's result. Idempotent for the same result; Conflict for an expired command or one
        that already has the other result; NotFound for a command of another node (or none)."""
        status = CommandStatus.SUCCEEDED if ok else CommandStatus.FAILED
        with self.session.begin() as s:
            r = s.get(CommandRow, key)
            if r is None or r.node != node:
                raise NotFound("command", key)
            if r.status == status:
                return _command(r)
            if r.status != CommandStatus.QUEUED:
                raise Conflict(f"command {key} is {r.status}: its result can no longer change")
            r.status, r.detail, r.updated = status, detail[:2000], now
            return _command(r)

    def expire(self, key: str, now: datetime) -> Command | None:
        """Give up on a queued command (no result in time); returns it as it is now (it may have
        finished meanwhile: then that result stands)."""
        with self.session.begin() as s:
            s.execute(update(CommandRow).where(CommandRow.id == key, CommandRow.status == CommandStatus.QUEUED)
                      .values(status=CommandStatus.EXPIRED, updated=now, detail="no result within the step timeout"))
            r = s.get(CommandRow, key)
            return None if r is None else _command(r)

    # ---- the repair log ---------------------------------------------------------------------
    def record(self, key: str, node: str, time: datetime, fault: str, step: RepairStep, ok: bool,
               detail: str) -> None:
        """One attempt and its outcome (a no-op when ``key`` is recorded already)."""
        try:
            with self.session.begin() as s:
                if s.scalar(select(RepairRow.seq).where(RepairRow.key == key)) is None:
                    s.add(RepairRow(key=key, node=node, time=time, fault=fault, step=step.value, ok=ok,
                                    detail=detail[:2000]))
        except IntegrityError:  # a concurrent writer recorded it first: the same attempt
            pass

    def history(self, node: str, since: datetime) -> list[RepairAttempt]:
        q = (select(RepairRow).where(RepairRow.node == node, RepairRow.time >= since)
             .order_by(RepairRow.time, RepairRow.seq))
        with self.session() as s:
            return [RepairAttempt(r.time, r.fault, RepairStep(r.step), r.ok) for r in s.scalars(q)]

    def evidence(self, node: str, ids: Sequence[str]) -> list[HealthEvent]:
        """The stored events of ``node`` with these ids (a decision's evidence)."""
        if not ids:
            return []
        q = select(EventRow).where(EventRow.node == node, EventRow.id.in_(list(ids)))
        with self.session() as s:
            return [event_of(r) for r in s.scalars(q)]
