"""Restart = resume: a Controller built on the same database continues exactly where the last one stopped."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine
from gpufleet.controller.store.repo import Store
from gpufleet.domain.events import EventKind
from gpufleet.domain.fleet import Node
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.lifecycle.engine import SchedObservation
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0, event

S = NodeState


def _fleet() -> list[Node]:
    return [Node(f"r0{r}-n{i:02d}", f"r0{r}") for r in (1, 2) for i in range(1, 11)]  # 20 nodes: budget 2


def _records(c: Controller) -> dict[str, tuple[object, ...]]:
    return {n: (r.state, r.since, r.domains, r.has_jobs, r.committed) for n, r in c.engine.nodes.items()}


def test_a_reloaded_controller_resumes_states_held_decisions_breaker_and_mode(engine: Engine, db_url: str) -> None:
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock)
    c.register(_fleet(), state=S.READY)

    at = clock.advance(timedelta(minutes=1))
    c.sync({"r01-n05": SchedObservation(has_jobs=True, drained_empty=False)})
    at = clock.advance(timedelta(seconds=10))
    # degraded on a busy node: suspect, drain committed for its next checkpoint (1 of 2 budget)
    c.ingest([event("x94", "r01-n05", code=94, at=at)])
    at = clock.advance(timedelta(minutes=1))
    c.ingest([event("x79-a", "r02-n01", code=79, at=at)])  # fatal: draining (2 of 2)
    at = clock.advance(timedelta(minutes=1))
    c.ingest([event("x79-b", "r01-n01", code=79, at=at)])  # fatal, over budget: held, breaker trips
    # 49 link errors: one short of the "50 in 10 minutes" escalation
    c.ingest([event(f"le{i}", "r02-n05", kind=EventKind.LINK_ERROR, code=None, at=at) for i in range(49)])
    c.set_dry_run(True, "operator:alice")

    assert c.state_of("r01-n05") == S.SUSPECT
    assert c.engine.nodes["r01-n05"].committed
    assert c.state_of("r02-n01") == S.DRAINING
    assert c.state_of("r01-n01") == S.SUSPECT
    assert c.breaker.tripped
    assert set(c.engine.held) == {"r01-n01"}
    assert c.state_of("r02-n05") == S.READY

    clock.advance(timedelta(minutes=1))
    other = make_engine(db_url)  # a new process: new engine, new Store, new Controller
    try:
        again = Controller(Store(other), load_policy(), clock)
        assert _records(again) == _records(c)
        assert again.breaker == c.breaker
        assert again.dry_run is True
        assert {n: d.id for n, d in again.engine.held.items()} == {n: d.id for n, d in c.engine.held.items()}
        assert again.engine.held["r01-n01"].status == DecisionStatus.HELD
        due = {a.id for a in again.store.due_actions(clock.now())}
        assert due == {a.id for a in c.store.due_actions(clock.now())}
        assert len(due) == 2  # drain_after_checkpoint of r01-n05, drain of r02-n01 (idle: no requeue)

        # The recent evidence came back too: the 50th link error escalates (recorded only: dry-run).
        at = clock.advance(timedelta(seconds=1))
        r = again.ingest([event("le49", "r02-n05", kind=EventKind.LINK_ERROR, code=None, at=at)])
        assert r.decisions == 1
        (d,) = again.store.decisions(node="r02-n05")
        assert (d.status, d.rule) == ("dry_run", "degraded_idle")
        assert again.state_of("r02-n05") == S.READY
    finally:
        other.dispose()


def test_a_controller_without_that_history_does_not_escalate(engine: Engine) -> None:
    """The control for the test above: one link error alone decides nothing."""
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock)
    c.register(_fleet(), state=S.READY)
    at = clock.advance(timedelta(minutes=4))
    assert c.ingest([event("le49", "r02-n05", kind=EventKind.LINK_ERROR, code=None, at=at)]).decisions == 0


def test_reset_breaker_and_mode_survive_a_restart(engine: Engine, db_url: str) -> None:
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock)
    c.register(_fleet(), state=S.READY)
    for i, node in enumerate(("r01-n01", "r02-n01", "r01-n02")):
        at = clock.advance(timedelta(minutes=1))
        c.ingest([event(f"f{i}", node, code=79, at=at)])
    assert c.breaker.tripped
    c.reset_breaker("operator:bob", discard_held=True)
    c.set_dry_run(True, "operator:bob")
    c.set_dry_run(False, "operator:bob")

    other = make_engine(db_url)
    try:
        again = Controller(Store(other), load_policy(), clock)
        assert not again.breaker.tripped
        assert again.engine.held == {}
        assert again.dry_run is False
        assert again.state_of("r01-n02") == S.READY
        assert {d.id: d.status for d in again.store.decisions(node="r01-n02")} == {
            d.id: "cancelled" for d in c.store.decisions(node="r01-n02")}
    finally:
        other.dispose()
