"""Memory never runs ahead of the database, even when the write fails AND the reload after it fails too.

Issue #16: a drain whose write failed while the database was down left the node ``draining`` in memory
(the reload from the database failed as well); every later drain or resume got ``409 node is draining``
until a restart. The outage here is the database connection refusing statements (an engine hook that
raises the driver-level error a dropped server gives), on SQLite and on the real PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.exc import OperationalError

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller, IngestResult
from gpufleet.controller.store.models import DecisionRow, NodeRow
from gpufleet.controller.store.repo import Store
from gpufleet.domain.errors import ExternalError
from gpufleet.domain.events import EventKind
from gpufleet.domain.fleet import Node
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0
from tests.integration.store.plans import event as make_event

NODES = ("r01-n01", "r01-n02", "r01-n03")


class Outage:
    """While ``down``, every statement on the engine fails as on a dropped server connection."""

    def __init__(self, engine: Engine) -> None:
        self.down = False
        self.refused = 0
        event.listen(engine, "before_cursor_execute", self._hook)

    def _hook(self, _conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.down:
            self.refused += 1
            raise OperationalError(statement, {}, ConnectionError("server closed the connection unexpectedly"))


@pytest.fixture
def outage(engine: Engine) -> Iterator[Outage]:
    o = Outage(engine)
    yield o
    o.down = False


@pytest.fixture
def controller(engine: Engine) -> Controller:
    c = Controller(Store(engine), load_policy(), ManualClock(T0))
    c.register([Node(n, "r01") for n in NODES], state=NodeState.READY)
    return c


def db_states(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return {n: s for n, s in conn.execute(select(NodeRow.id, NodeRow.state))}


def memory_states(c: Controller) -> dict[str, str]:
    return {n: r.state.value for n, r in c.engine.nodes.items()}


def test_a_failed_drain_whose_reload_fails_too_leaves_memory_as_the_database(
        engine: Engine, controller: Controller, outage: Outage) -> None:
    outage.down = True
    with pytest.raises(ExternalError, match="database"):
        controller.operate("r01-n01", OperatorOp.DRAIN, "alice")
    assert outage.refused >= 2  # the write, then the reload's first read
    outage.down = False
    assert memory_states(controller) == db_states(engine) == dict.fromkeys(NODES, "ready")
    assert controller.engine.unavailable() == set()
    # The operator's retry is carried out (before the fix: 409 "node is draining" until a restart).
    plan = controller.operate("r01-n01", OperatorOp.DRAIN, "alice")
    assert [t.to_state for t in plan.transitions] == [NodeState.DRAINING]
    assert memory_states(controller) == db_states(engine)


def test_a_failed_ingest_round_whose_reload_fails_too_forgets_its_events(
        engine: Engine, controller: Controller, outage: Outage) -> None:
    at = T0 + timedelta(seconds=1)
    sbes = [make_event(f"s{i}", "r01-n02", kind=EventKind.ECC_SBE, code=None, at=at) for i in range(3)]
    outage.down = True
    with pytest.raises(ExternalError):
        controller.ingest([make_event("x1", "r01-n01", at=at), *sbes])
    outage.down = False
    assert memory_states(controller) == db_states(engine) == dict.fromkeys(NODES, "ready")
    assert controller.admission.held == 0
    assert all(not r.recent for r in controller.engine.nodes.values())  # no sighting of an event never stored
    # The agent's resend is new to the controller: stored, counted once, decided on.
    assert controller.ingest([make_event("x1", "r01-n01", at=at), *sbes]) == IngestResult(4, 0, 1)
    assert memory_states(controller) == db_states(engine)
    assert db_states(engine)["r01-n01"] == "draining"


def test_a_failed_registration_and_breaker_reset_leave_memory_as_the_database(
        engine: Engine, controller: Controller, outage: Outage) -> None:
    outage.down = True
    with pytest.raises(ExternalError):
        controller.register([Node("r02-n01", "r02")], state=NodeState.READY)
    with pytest.raises(ExternalError):
        controller.set_dry_run(not controller.dry_run, "alice")
    outage.down = False
    assert "r02-n01" not in controller.engine.nodes
    assert set(controller.engine.nodes) == set(db_states(engine))
    dry_run = controller.dry_run
    assert controller.store.load_settings()[1] in (None, dry_run)
    assert controller.register([Node("r02-n01", "r02")], state=NodeState.READY) == 1
    with engine.connect() as conn:
        assert conn.execute(select(DecisionRow.id)).all() == []
