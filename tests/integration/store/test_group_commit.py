"""Group commit: concurrent ingest batches share one transaction, yet each is accepted or rejected whole.

Runs on SQLite and on the real PostgreSQL, like the rest of the store suite. Failures of the shared
write are made by the database itself (a trigger that refuses one event id), not by a stand-in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, event, func, select, text

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.ingest import GroupCommitter
from gpufleet.controller.service import Controller, Heartbeat, IngestResult
from gpufleet.controller.store.models import DecisionRow, EventRow, NodeRow
from gpufleet.controller.store.repo import Store
from gpufleet.domain.errors import ExternalError, GpufleetError, InvalidInput, NotFound
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import Node
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0
from tests.integration.store.plans import event as make_event

NODES = ("r01-n01", "r01-n02", "r01-n03")


@pytest.fixture
def controller(engine: Engine) -> Controller:
    c = Controller(Store(engine), load_policy(), ManualClock(T0))
    c.register([Node(n, "r01") for n in NODES], state=NodeState.READY)
    return c


def sbe(eid: str, node: str = "r01-n01") -> HealthEvent:
    return make_event(eid, node, kind=EventKind.ECC_SBE, code=None, at=T0 + timedelta(seconds=1))


def fatal(eid: str, node: str) -> HealthEvent:
    return make_event(eid, node, kind=EventKind.XID, code=79, at=T0 + timedelta(seconds=1))


def stored_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(select(EventRow.id)).scalars())


def count(engine: Engine, model: type[EventRow] | type[DecisionRow]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


@pytest.fixture
def commits(engine: Engine) -> Iterator[list[int]]:
    """How many transactions were committed on ``engine`` (appended to while the test runs)."""
    seen: list[int] = []

    def on_commit(_conn: object) -> None:
        seen.append(1)

    event.listen(engine, "commit", on_commit)
    yield seen
    event.remove(engine, "commit", on_commit)


def test_a_group_is_one_transaction_with_an_answer_per_batch(engine: Engine, controller: Controller,
                                                             commits: list[int]) -> None:
    controller.ingest([sbe("old-1"), sbe("old-2")])
    before = len(commits)
    results = controller.ingest_many([
        [sbe("a1"), fatal("a2", "r01-n02")],            # fine, one decision
        [sbe("b1"), sbe("b2", "r99-n99")],              # unknown node: refused whole
        [sbe("a1"), sbe("c1")],                         # a1 came one batch earlier: a duplicate
        [sbe("old-1"), sbe("old-2")],                   # all stored already
        [sbe("d1"), sbe("d1")],                         # an id repeated inside a batch: refused whole
    ])
    assert len(commits) - before == 1
    first, second, third, fourth, fifth = results
    assert first == IngestResult(2, 0, 1)
    assert isinstance(second, InvalidInput)
    assert (second.field, second.value) == ("events[1].node", "r99-n99")
    assert third == IngestResult(1, 1, 0)
    assert fourth == IngestResult(0, 2, 0)
    assert isinstance(fifth, InvalidInput)
    assert fifth.field == "events[1].id"
    assert stored_ids(engine) == {"old-1", "old-2", "a1", "a2", "c1"}
    assert controller.state_of("r01-n02") == NodeState.DRAINING


def test_a_batch_that_breaks_the_shared_write_fails_alone(engine: Engine, controller: Controller) -> None:
    _refuse_event_id(engine, "poison")
    results = controller.ingest_many([
        [sbe("g1"), fatal("g2", "r01-n01")],
        [sbe("p1", "r01-n02"), fatal("poison", "r01-n02")],
        [fatal("g3", "r01-n03")],
    ])
    good1, bad, good2 = results
    assert good1 == IngestResult(2, 0, 1)
    assert isinstance(bad, ExternalError)
    assert "poison" in str(bad)
    assert good2 == IngestResult(1, 0, 1)
    assert stored_ids(engine) == {"g1", "g2", "g3"}  # nothing of the refused batch, not even p1
    # Memory never runs ahead of the database: the refused batch's fatal event decided nothing.
    with engine.connect() as conn:
        rows = {node: state for node, state in conn.execute(select(NodeRow.id, NodeRow.state))}
    assert {n: controller.state_of(n).value for n in NODES} == rows
    assert rows["r01-n02"] == NodeState.READY.value
    assert count(engine, DecisionRow) == 2


def test_a_lone_batch_that_breaks_the_write_gets_a_503_error_and_state_is_reloaded(
        engine: Engine, controller: Controller) -> None:
    _refuse_event_id(engine, "poison")
    with pytest.raises(ExternalError, match="poison"):
        controller.ingest([fatal("poison", "r01-n01")])
    assert controller.state_of("r01-n01") == NodeState.READY
    assert stored_ids(engine) == set()
    assert controller.ingest([fatal("fine", "r01-n01")]) == IngestResult(1, 0, 1)


def test_concurrent_requests_share_rounds_and_each_gets_its_own_answer(engine: Engine, controller: Controller,
                                                                         commits: list[int]) -> None:
    committer = GroupCommitter(controller)
    batches = [[sbe(f"c{i}-{j}", NODES[i % 3]) for j in range(i % 4 + 1)] for i in range(20)]
    batches[7] = [sbe("bad", "r99-n99")]
    before = len(commits)
    with controller.lock:  # the writer cannot start a round until all twenty are queued
        futures = [committer.submit(b) for b in batches]
    answers: list[IngestResult | GpufleetError] = []
    for f in futures:
        err = f.exception(timeout=30)
        answers.append(err if isinstance(err, GpufleetError) else f.result())
    committer.close()
    assert committer.batches == 20
    assert committer.rounds <= 2
    assert len(commits) - before <= 2
    for i, (batch, answer) in enumerate(zip(batches, answers, strict=True)):
        if i == 7:
            assert isinstance(answer, InvalidInput)
        else:
            assert answer == IngestResult(len(batch), 0, 0)
    assert stored_ids(engine) == {e.id for i, b in enumerate(batches) if i != 7 for e in b}


def test_the_writer_survives_a_failing_round_and_refuses_work_once_closed(controller: Controller) -> None:
    committer = GroupCommitter(controller)
    real = controller.ingest_many
    calls = threading.Event()

    def broken_once(batches: list[list[HealthEvent]]) -> list[IngestResult | GpufleetError]:
        if not calls.is_set():
            calls.set()
            raise RuntimeError("a bug in one round")
        return real(batches)

    controller.ingest_many = broken_once  # type: ignore[method-assign]
    failed = committer.submit([sbe("x1")])
    err = failed.exception(timeout=30)
    assert isinstance(err, ExternalError)
    assert "a bug in one round" in str(err)
    assert committer.submit([sbe("x2")]).result(timeout=30) == IngestResult(1, 0, 0)
    committer.close()
    refused = committer.submit([sbe("x3")]).exception(timeout=1)
    assert isinstance(refused, ExternalError)
    assert "shutting down" in str(refused)


def test_max_group_events_must_be_positive(controller: Controller) -> None:
    with pytest.raises(ValueError, match="max_group_events must be at least 1, got 0"):
        GroupCommitter(controller, max_group_events=0)


def _refuse_event_id(engine: Engine, eid: str) -> None:
    """Make the database itself refuse to store an event with id ``eid``."""
    with engine.begin() as conn:
        if engine.dialect.name == "sqlite":
            conn.execute(text(f"CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.id = '{eid}' "
                              "BEGIN SELECT RAISE(ABORT, 'event id refused by test trigger: poison'); END"))
        else:
            conn.execute(text(f"""CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN
                IF NEW.id = '{eid}' THEN RAISE EXCEPTION 'event id refused by test trigger: poison'; END IF;
                RETURN NEW; END $$ LANGUAGE plpgsql"""))
            conn.execute(text("CREATE TRIGGER refuse BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse()"))


def test_heartbeats_of_a_round_are_one_transaction_and_an_unknown_node_fails_alone(
        engine: Engine, controller: Controller, commits: list[int]) -> None:
    committer = GroupCommitter(controller)
    later = T0 + timedelta(seconds=5)
    before = len(commits)
    with controller.lock:  # everything below queues up before the writer can start
        beats = [committer.submit_heartbeat(Heartbeat(n, later, f"v{i}")) for i, n in enumerate(NODES)]
        unknown = committer.submit_heartbeat(Heartbeat("r99-n99", later, "v9"))
        batch = committer.submit([sbe("hb-e1")])
    for f in beats:
        assert f.result(timeout=30) is None
    err = unknown.exception(timeout=30)
    assert isinstance(err, NotFound)
    assert "r99-n99" in str(err)
    assert batch.result(timeout=30) == IngestResult(1, 0, 0)
    committer.close()
    assert len(commits) - before <= 4  # at most two rounds, each one events and one heartbeat transaction
    with engine.connect() as conn:
        rows = {n: (hb, v) for n, hb, v in conn.execute(select(NodeRow.id, NodeRow.last_heartbeat,
                                                                NodeRow.agent_version))}
    # Liveness is the controller's receive time; the agents' clocks (5 s ahead) are measured, not trusted.
    assert rows == {n: (controller.clock.now(), f"v{i}") for i, n in enumerate(NODES)}
    assert controller.clock_skew == dict.fromkeys(NODES, 5.0)


def test_a_request_cancelled_while_queued_is_skipped_and_the_writer_keeps_serving(
        engine: Engine, controller: Controller) -> None:
    committer = GroupCommitter(controller)
    with controller.lock:
        first = committer.submit([sbe("k0")])
        deadline = time.monotonic() + 30
        while not committer._queue.empty():  # the writer has taken the first round and waits for the lock
            assert time.monotonic() < deadline, "the writer never took the first batch"
        gone = committer.submit([sbe("k1")])
        assert gone.cancel()  # still queued: its caller gave up (e.g. a cancelled request task)
    assert first.result(timeout=30) == IngestResult(1, 0, 0)
    assert committer.submit([sbe("k2")]).result(timeout=30) == IngestResult(1, 0, 0)
    assert committer.submit_heartbeat(Heartbeat(NODES[0], T0)).result(timeout=30) is None
    committer.close()
    assert stored_ids(engine) == {"k0", "k2"}
