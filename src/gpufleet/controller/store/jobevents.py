"""The store's read for a training job's infrastructure events (``GET /v1/jobs/{job}/events``): the
newest events, transitions and outbox actions on the job's nodes in a time range, in three statements
whatever the number of nodes."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import TypeVar

from sqlalchemy import ColumnElement, SQLColumnExpression, func, select

from .keys import one_of
from .models import ActionRow, EventRow, TransitionRow
from .repo import Store

R = TypeVar("R", EventRow, TransitionRow, ActionRow)


def _first_per_node(rows: Iterable[R], k: int) -> list[R]:
    """``rows`` less each node's rows after its first ``k`` (the order is kept)."""
    seen: dict[str, int] = {}
    out: list[R] = []
    for row in rows:
        n = seen[row.node] = seen.get(row.node, 0) + 1
        if n <= k:
            out.append(row)
    return out


def newest_on(store: Store, nodes: Collection[str], since: datetime, until: datetime, per_node: int,
              ) -> tuple[list[EventRow], list[TransitionRow], list[ActionRow]]:
    """What ``events(node=n, ...)``, ``transitions(n, ...)`` and ``actions(node=n, ...)`` with limit
    ``per_node`` over ``[since, until)`` give for every node ``n`` of ``nodes`` (each list in its
    method's order, one node's rows in the same order), less rows that have ``per_node`` newer rows
    of their own table among those: a list merged from the three can then take its newest
    ``per_node`` from here as from the node-by-node reads. Three statements whatever the number of
    nodes (``GET /v1/jobs/{job}/events``; a node-by-node read was three statements per node).

    Each statement reads the rows of its table at or after a cut and keeps each node's first
    ``per_node`` of them: for events and actions (newest time first) the cut is the ``per_node``-th
    newest time over all ``nodes``; for transitions (newest ``seq`` first) it is the lowest ``seq``
    at or after the oldest time among the ``per_node`` highest ``seq``. Either way each node keeps a
    prefix of its own order that holds its part of the table's ``per_node`` newest, and a row
    before the cut has ``per_node`` newer ones kept. The nodes are bound as one parameter
    (:func:`one_of`): the statements cannot be split, each orders and cuts over all of them."""
    k = per_node

    def where(node: SQLColumnExpression[str], time: SQLColumnExpression[datetime]) -> list[ColumnElement[bool]]:
        return [one_of(store.engine.dialect.name, node, nodes), time >= since, time < until]

    ev, tr, ac = EventRow, TransitionRow, ActionRow
    newest_ev = select(ev.time).where(*where(ev.node, ev.time)).order_by(ev.time.desc()).limit(k).subquery()
    q_ev = (select(ev).where(*where(ev.node, ev.time), ev.time >= select(func.min(newest_ev.c.time))
                             .scalar_subquery()).order_by(ev.time.desc(), ev.seq.desc()))
    newest_ac = (select(ac.created).where(*where(ac.node, ac.created)).order_by(ac.created.desc()).limit(k)
                 .subquery())
    q_ac = (select(ac).where(*where(ac.node, ac.created), ac.created >= select(func.min(newest_ac.c.created))
                             .scalar_subquery()).order_by(ac.created.desc(), ac.id))
    newest_tr = select(tr.time).where(*where(tr.node, tr.time)).order_by(tr.seq.desc()).limit(k).subquery()
    oldest_time = select(func.min(newest_tr.c.time)).scalar_subquery()
    # seq + 0: PostgreSQL would read min(seq) as the first match walking the whole table by seq; the few
    # rows at or after oldest_time come by ix_transitions_node_time instead
    lowest_seq = select(func.min(tr.seq + 0)).where(*where(tr.node, tr.time), tr.time >= oldest_time)
    q_tr = (select(tr).where(*where(tr.node, tr.time), tr.seq >= lowest_seq.scalar_subquery())
            .order_by(tr.seq.desc()))
    with store.session() as s:
        return (_first_per_node(s.scalars(q_ev), k), _first_per_node(s.scalars(q_tr), k),
                _first_per_node(s.scalars(q_ac), k))
