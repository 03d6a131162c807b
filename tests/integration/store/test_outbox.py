"""The outbox: which actions are due, in what order, and how outcomes and retries are recorded."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from gpufleet.controller.store.repo import ActionStatus, Store
from gpufleet.lifecycle.plan import Plan
from tests.integration.store.plans import T0, drain_plan, node_record


def _outbox(store: Store) -> None:
    """Three decisions created at T0+2s, T0, T0+1s (two actions each: drain, then requeue 1 µs later)."""
    nodes = [(node_record(f"r01-n0{i}"), "r01", T0) for i in (1, 2, 3)]
    store.commit(Plan(), new_nodes=nodes)
    for node, did, offset in (("r01-n01", "d-c", 2), ("r01-n02", "d-a", 0), ("r01-n03", "d-b", 1)):
        plan = drain_plan(node, did, T0 + timedelta(seconds=offset))
        plan.breaker = plan.dry_run = None
        store.commit(plan)


def test_due_actions_are_open_and_due_oldest_first(engine: Engine) -> None:
    store = Store(engine)
    _outbox(store)
    now = T0 + timedelta(seconds=10)
    due = [a.id for a in store.due_actions(now)]
    assert due == ["d-a:drain", "d-a:requeue_jobs", "d-b:drain", "d-b:requeue_jobs", "d-c:drain",
                   "d-c:requeue_jobs"]
    assert [a.id for a in store.due_actions(now, limit=3)] == due[:3]
    # Only what was created by `now` is due.
    assert [a.id for a in store.due_actions(T0 + timedelta(seconds=1))] == due[:3]
    assert store.due_actions(T0 - timedelta(seconds=1)) == []


def test_update_action_records_outcomes_and_backoff(engine: Engine) -> None:
    store = Store(engine)
    _outbox(store)
    now = T0 + timedelta(seconds=10)
    retry_at = now + timedelta(seconds=4)
    store.update_action("d-a:drain", status=ActionStatus.PENDING, now=now, attempts=1, next_attempt=retry_at,
                        error="scheduler: connection refused")
    store.update_action("d-b:drain", status=ActionStatus.DONE, now=now, result="drained")
    store.update_action("d-c:drain", status=ActionStatus.WAITING, now=now, next_attempt=now + timedelta(seconds=30),
                        result="waiting for a checkpoint")
    store.update_action("d-c:requeue_jobs", status=ActionStatus.FAILED, now=now, attempts=50, error="gave up")

    a = store.action("d-a:drain")
    assert a is not None
    assert (a.status, a.attempts, a.next_attempt, a.last_error, a.updated) == (
        "pending", 1, retry_at, "scheduler: connection refused", now)
    b = store.action("d-b:drain")
    assert b is not None
    assert (b.status, b.result, b.attempts) == ("done", "drained", 0)

    # Backed-off, done, failed and not-yet-due waiting actions are not due; the rest keep their order.
    assert [x.id for x in store.due_actions(now)] == ["d-a:requeue_jobs", "d-b:requeue_jobs"]
    assert "d-a:drain" in [x.id for x in store.due_actions(retry_at)]
    assert "d-c:drain" in [x.id for x in store.due_actions(now + timedelta(seconds=30))]
    assert {x.id for x in store.actions(status="failed")} == {"d-c:requeue_jobs"}


def test_retry_action_requeues_a_failed_action_and_audits_it(engine: Engine) -> None:
    store = Store(engine)
    _outbox(store)
    failed_at = T0 + timedelta(seconds=10)
    store.update_action("d-a:drain", status=ActionStatus.FAILED, now=failed_at, attempts=50,
                        next_attempt=failed_at + timedelta(minutes=5), error="gave up")
    later = failed_at + timedelta(hours=1)
    store.retry_action("d-a:drain", later, "operator:alice")
    a = store.action("d-a:drain")
    assert a is not None
    assert (a.status, a.attempts, a.next_attempt, a.updated) == ("pending", 0, later, later)
    assert "d-a:drain" in [x.id for x in store.due_actions(later)]
    (entry,) = [e for e in store.audit() if e.action == "retry_action"]
    assert (entry.actor_id, entry.target, entry.time) == ("operator:alice", "d-a:drain", later)


def test_an_action_id_is_queued_once(engine: Engine) -> None:
    """Committing the same decision again (a replay after a crash) does not duplicate or reset its actions."""
    store = Store(engine)
    _outbox(store)
    store.update_action("d-a:drain", status=ActionStatus.DONE, now=T0 + timedelta(seconds=3), result="drained")
    plan = drain_plan("r01-n02", "d-a", T0)
    plan.breaker = plan.dry_run = None
    plan.transitions.clear()
    store.commit(plan)
    rows = [a for a in store.actions() if a.decision_id == "d-a"]
    assert sorted(a.id for a in rows) == ["d-a:drain", "d-a:requeue_jobs"]
    assert {a.id: a.status for a in rows}["d-a:drain"] == "done"
