"""Node pool bookkeeping: slots, spares, repair, epochs."""

from __future__ import annotations

from gpufleet.sim.nodes import IN_JOB, REPAIR, SPARE, NodePool


def test_finite_pool_refills_from_spares_then_runs_short() -> None:
    pool = NodePool(3, 1, unlimited=False)
    assert pool.remove(1) and not pool.remove(1)
    assert pool.status[1] == REPAIR and pool.epoch[1] == 1
    assert pool.fill() == (True, [])
    assert pool.status[3] == IN_JOB and pool.slots[1] == 3
    pool.remove(0)
    assert pool.fill() == (False, [])
    assert pool.at(0) == -1  # in repair: not exposed
    pool.repair_over()
    pool.returned(1)
    assert pool.status[1] == SPARE
    assert pool.fill() == (True, [])
    assert pool.peak_in_repair == 2 and pool.in_repair == 1


def test_unlimited_pool_creates_nodes_and_exposes_only_job_slots() -> None:
    pool = NodePool(2, 0, unlimited=True, nodes_per_rack=2)
    assert pool.exposed() == 2
    pool.remove(0)
    ok, created = pool.fill()
    assert ok and created == [(2, 0)]
    assert pool.at(0) == 2
    assert pool.domains(2, 0) == frozenset({"rack:r00000"})
    assert pool.name(2) == "node00002"
