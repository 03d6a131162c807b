"""Maintenance rollouts on both databases: a rollout survives a restart mid-action and resumes with
nothing queued twice; every step's audit line is written with it."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import Conflict, NotFound
from tests.integration.reconciler.test_maintenance import World


def test_a_rollout_resumes_after_a_restart_and_runs_each_action_once(db_url: str) -> None:
    w = World(db_url, nodes=4, racks=2)
    rid = w.m.plan({"selector": "rack:r01", "action": "script:driver-update", "max_unavailable": 1}, "op").id
    w.m.start(rid, "op")
    for _ in range(4):
        w.step()
    first = next(n for n, s in w.steps(rid).items() if s == "action")
    w.restart()  # mid-action: the command is queued, its result not in
    assert w.m.store.held_nodes() == {first} and w.c.under_maintenance == {first}
    assert w.run(rid) == "done"
    assert sorted(n for n, _ in w.ran) == sorted(w.steps(rid)) and len(w.ran) == 2
    assert [a for a, _ in w.audit(first)].count("maintenance_action") == 1
    with_rollout = w.m.store.list()
    assert [r.id for r in with_rollout] == [rid] and with_rollout[0].state == "done"
    with pytest.raises(Conflict, match="is done"):
        w.m.start(rid, "op")  # a finished rollout cannot be started again
    with pytest.raises(NotFound):
        w.m.store.get("m-nope")


def test_the_summaries_count_nodes_per_step_and_keep_a_tenants_own_rollouts_only(db_url: str) -> None:
    w = World(db_url, nodes=4, racks=2)
    r01 = w.m.plan({"selector": "rack:r01", "action": "reboot"}, "op").id
    rack1 = frozenset(w.steps(r01))
    everyone = w.m.plan({"selector": "all", "action": "reboot"}, "op").id
    counts = {s.id: s.counts for s in w.m.store.summaries()}
    assert counts == {r01: {"pending": len(rack1)}, everyone: {"pending": 4}} and len(rack1) == 2
    assert [s.id for s in w.m.store.summaries(within=rack1)] == [r01]  # a tenant owning rack r01's nodes
    assert w.m.store.summaries(within=frozenset()) == []
    assert len(w.m.store.summaries(limit=1)) == 1
