"""Group commit changes nothing but speed: any batches, grouped any way, give the same answers, rows
and node states as the same batches ingested one by one (Hypothesis; two controllers side by side)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, select

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller, IngestResult
from gpufleet.controller.store.db import migrate, throwaway_engine
from gpufleet.controller.store.models import DecisionRow, EventRow, NodeRow, TransitionRow
from gpufleet.controller.store.repo import Store
from gpufleet.domain.errors import GpufleetError, InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import Node
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0

NODES = [f"r{r:02d}-n{i:02d}" for r in (1, 2) for i in range(1, 11)]  # 20 nodes: the budget allows 2
KINDS = [(EventKind.ECC_SBE, None), (EventKind.XID, 13), (EventKind.XID, 79), (EventKind.XID, 94),
         (EventKind.LINK_ERROR, None), (EventKind.ROW_REMAP_PENDING, None)]


@st.composite
def batches(draw: st.DrawFn) -> list[list[HealthEvent]]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        events = []
        for _ in range(draw(st.integers(1, 4))):
            kind, code = draw(st.sampled_from(KINDS))
            node = draw(st.sampled_from([*NODES[:6], "r99-n99"]))  # few nodes: escalations and repeats happen
            at = T0 + timedelta(seconds=draw(st.integers(0, 30)))
            events.append(HealthEvent(f"e{draw(st.integers(0, 25))}", node, kind, at, f"{node}-gpu0", code))
        out.append(events)
    return out


def _controller() -> tuple[Controller, Engine]:
    engine = throwaway_engine()
    migrate(engine)
    c = Controller(Store(engine), load_policy(), ManualClock(T0 + timedelta(minutes=1)))
    c.register([Node(n, n[:3]) for n in NODES], state=NodeState.READY)
    return c, engine


def _answer(r: IngestResult | GpufleetError) -> Any:
    if isinstance(r, InvalidInput):
        return ("invalid", r.field, r.value)
    if isinstance(r, GpufleetError):
        return (type(r).__name__, str(r))
    return r


def _rows(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
            "events": sorted(conn.execute(select(EventRow.id, EventRow.node, EventRow.kind, EventRow.code)).all()),
            "decisions": sorted(conn.execute(select(DecisionRow.id, DecisionRow.node, DecisionRow.rule,
                                                    DecisionRow.status, DecisionRow.evidence)).all()),
            "transitions": conn.execute(select(TransitionRow.node, TransitionRow.from_state, TransitionRow.to_state,
                                               TransitionRow.decision_id).order_by(TransitionRow.seq)).all(),
            "nodes": sorted(conn.execute(select(NodeRow.id, NodeRow.state, NodeRow.committed)).all()),
        }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=batches(), cuts=st.lists(st.integers(1, 5), min_size=1, max_size=12))
def test_grouped_ingest_is_indistinguishable_from_one_by_one(data: list[list[HealthEvent]], cuts: list[int]) -> None:
    one, one_db = _controller()
    grouped, grouped_db = _controller()
    alone: list[Any] = []
    for batch in data:
        try:
            alone.append(_answer(one.ingest(batch)))
        except GpufleetError as err:
            alone.append(_answer(err))
    together: list[Any] = []
    i = 0
    for size in cuts * len(data):
        if i >= len(data):
            break
        together += [_answer(r) for r in grouped.ingest_many(data[i:i + size])]
        i += size
    assert together == alone
    assert _rows(grouped_db) == _rows(one_db)
    assert {n: grouped.state_of(n) for n in NODES} == {n: one.state_of(n) for n in NODES}
    assert grouped.breaker == one.breaker
