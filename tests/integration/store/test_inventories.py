"""Inventories: the last document each node registered, and the identities a restarted controller keeps."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import make_engine
from gpufleet.controller.store.models import EventRow, InventoryRow
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.controller.store.repo import Store
from gpufleet.domain.errors import ExternalError
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.inventory import GpuUnit, IbPort, NicUnit, NodeInventory
from gpufleet.domain.topology import to_fleet
from gpufleet.domain.topology_gen import generate_nvl72
from gpufleet.lifecycle.config import PolicyFile, load_policy
from gpufleet.lifecycle.engine import OperatorOp, SchedObservation
from gpufleet.lifecycle.repair import RepairStep
from gpufleet.lifecycle.states import NodeState
from tests.integration.store.plans import T0
from tests.inventories import inventory_of

FULL = NodeInventory(
    "r01-n01", "NODE-00017",
    (GpuUnit(0, "GPU-5d1e", "1654922006281", "0000:18:00.0", "NVIDIA H100 80GB HBM3", 18),
     GpuUnit(1, "GPU-77aa", "1654922006282", "0000:2a:00.0", "NVIDIA H100 80GB HBM3", 18)),
    (NicUnit("mlx5_0", "ibp24s0", "0000:18:00.1", "MT2231X00001",
             (IbPort(1, "0x9c63c00300abcd01", "InfiniBand"), IbPort(2, "0x9c63c00300abcd02", "Ethernet"))),),
)


def test_an_inventory_comes_back_as_saved_and_a_later_one_replaces_it(engine: Engine) -> None:
    store = Store(engine)
    assert store.inventory("r01-n01") is None and store.load_inventories() == []
    store.save_inventory(FULL, T0)
    assert store.inventory("r01-n01") == FULL
    other = NodeInventory("r01-n02", "NODE-00018")
    store.save_inventory(other, T0 + timedelta(seconds=1))
    changed = NodeInventory("r01-n01", "NODE-00099", FULL.gpus[:1])
    store.save_inventory(changed, T0 + timedelta(seconds=2))
    assert store.inventory("r01-n01") == changed
    assert store.load_inventories() == [other, changed]  # least recently registered first


def test_a_restarted_controller_remembers_where_units_are(engine: Engine, db_url: str) -> None:
    topo = generate_nvl72(2)
    a, b = "r01-ct03", "r02-ct07"
    clock = ManualClock(T0)
    c = Controller(Store(engine), load_policy(), clock, topology=topo)
    c.register_fleet(to_fleet(topo), NodeState.READY)
    moved_here = NodeInventory(b, topo.components[a].serial)  # tray a's chassis now answers as b
    (moved,) = c.register_inventory(moved_here)
    assert dict(moved.attrs) == {"serial": topo.components[a].serial, "from": a, "to": b}
    stored = c.store.events(node=b, kind="moved")
    assert [(e.id, e.source, e.component) for e in stored] == [(moved.id, "controller", b)]

    clock.advance(timedelta(hours=1))
    other = make_engine(db_url)  # a new process
    try:
        again = Controller(Store(other), load_policy(), clock, topology=topo)
        assert again.register_inventory(moved_here) == []  # remembered: not a second move
        (back,) = again.register_inventory(NodeInventory(a, topo.components[a].serial))
        assert (back.kind, dict(back.attrs)["from"], dict(back.attrs)["to"]) == (EventKind.MOVED, b, a)
    finally:
        other.dispose()


class _FailingOnce(Store):
    """The real store, except that the first inventory write fails (a database that went away)."""

    failed = False

    def save_inventory(self, inv: NodeInventory, now: datetime, reference: NodeInventory | None = None) -> None:
        if not self.failed:
            self.failed = True
            raise OperationalError("UPDATE inventories", {}, Exception("server closed the connection"))
        super().save_inventory(inv, now, reference)


def test_a_failed_write_forgets_the_moves_so_the_retry_finds_them(engine: Engine) -> None:
    topo = generate_nvl72(1)
    a, b = "r01-ct03", "r01-ct07"
    c = Controller(_FailingOnce(engine), load_policy(), ManualClock(T0), topology=topo)
    c.register_fleet(to_fleet(topo), NodeState.READY)
    report = NodeInventory(b, topo.components[a].serial)
    with pytest.raises(ExternalError):
        c.register_inventory(report)
    assert c.store.inventory(b) is None
    (moved,) = c.register_inventory(report)
    assert dict(moved.attrs) == {"serial": topo.components[a].serial, "from": a, "to": b}
    assert c.store.inventory(b) == report


TRAY = "r01-ct03"


def _tray_short_of_gpu0(store: Store, policy: PolicyFile | None = None,
                        ) -> tuple[Controller, ManualClock, NodeInventory, NodeInventory]:
    """A controller over ``store`` with an NVL72 rack registered, and two reports of tray ``TRAY``: every
    GPU there (each with its PCI address), then GPU 0 gone (NVML numbers the others one lower)."""
    topo = generate_nvl72(1)
    full = inventory_of(topo, TRAY, pci={i: f"0000:{0x18 + 0x20 * i:02x}:00.0" for i in range(4)})
    gone = replace(full, gpus=tuple(replace(g, index=i) for i, g in enumerate(full.gpus[1:])))
    clock = ManualClock(T0)
    c = Controller(store, policy or load_policy(), clock, topology=topo)
    c.register_fleet(to_fleet(topo), NodeState.READY)
    return c, clock, full, gone


def _in_repair_short_of_gpu0(store: Store, tmp_path: Path) -> tuple[Controller, ManualClock, NodeInventory,
                                                                    NodeInventory]:
    """:func:`_tray_short_of_gpu0`, its missing GPU registered, the tray drained and handed to repair."""
    policy = tmp_path / "policy.toml"
    policy.write_text("[policy]\nauto_repair = true\n")
    c, clock, full, gone = _tray_short_of_gpu0(store, load_policy(policy))
    c.register_inventory(full)
    c.register_inventory(gone)
    c.sync({TRAY: SchedObservation(has_jobs=False, drained_empty=True)})
    clock.advance(timedelta(seconds=1))
    c.tick()
    assert c.engine.nodes[TRAY].state is NodeState.REPAIR
    return c, clock, full, gone


def _rung_worked(c: Controller, clock: ManualClock, step: RepairStep, detail: str) -> None:
    """The ladder's ``step`` on ``TRAY`` is recorded as it is when its outcome is seen (now), the tray goes
    to revalidation, and a second later the controller's time-driven pass runs."""
    key = f"{step.value}-1"
    RepairStore(c.store).record(key, TRAY, clock.now(), "gpu_lost", step, True, detail)
    c.repair_succeeded(TRAY, step.value, "full", key)
    assert c.engine.nodes[TRAY].state is NodeState.REVALIDATE
    clock.advance(timedelta(seconds=1))
    c.tick()


def _put_back_short_of_gpu0(store: Store, tmp_path: Path) -> tuple[Controller, ManualClock, NodeInventory]:
    """:func:`_tray_short_of_gpu0` at a site that judges a missing GPU degraded: the tray, running a job,
    turns suspect on the gap, and an operator who knows resumes it a minute later."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[override]]\nkind = "gpu_lost"\nrule = "gpu_missing"\nseverity = "degraded"\n'
                      'action = "drain_and_inspect"\n')
    c, clock, full, gone = _tray_short_of_gpu0(store, load_policy(policy))
    c.register_inventory(full)
    c.sync({TRAY: SchedObservation(has_jobs=True, drained_empty=False)})
    c.register_inventory(gone)
    clock.advance(timedelta(minutes=1))
    c.operate(TRAY, OperatorOp.RESUME, "operator:ops-alice", "GPU 0 is out until the next window")
    return c, clock, gone


def test_a_restarted_controller_keeps_the_slots_of_an_inventory_missing_a_gpu(engine: Engine, db_url: str) -> None:
    c, clock, full, gone = _tray_short_of_gpu0(Store(engine))
    topo, tray = c.topology, TRAY
    assert topo is not None
    assert c.register_inventory(full) == []
    clock.advance(timedelta(minutes=5))
    (lost,) = c.register_inventory(gone)  # GPU 0 did not come back: no moves for the three after it
    (stored,) = c.store.events(node=tray, kind="gpu_lost")
    assert (stored.id, stored.component) == (lost.id, f"{tray}-gpu0")
    assert c.engine.nodes[tray].state is NodeState.DRAINING  # judged fatal: no job is given a 3-GPU tray
    assert (c.store.load_inventories(), [r.inventory for r in c.store.load_references()]) == ([gone], [full])

    clock.advance(timedelta(hours=1))
    other = make_engine(db_url)  # a new process
    try:
        again = Controller(Store(other), load_policy(), clock, topology=topo)
        named = again.identity.resolve(HealthEvent("x", tray, EventKind.XID, clock.now(), code=79,
                                                   attrs=(("gpu", "0"),)))
        assert named.component == f"{tray}-gpu1"  # the agent's GPU 0 is the one in slot 1
        assert [e.kind for e in again.register_inventory(gone)] == [EventKind.GPU_LOST]
    finally:
        other.dispose()


def test_stored_events_keep_their_slots_after_a_restart_with_a_gpu_missing(engine: Engine, db_url: str) -> None:
    """A restarted controller judges the stored events again but does not name them again: named with the
    agent's numbering of now (GPU 0 missing since), the NVML XID of GPU 2 seen before the gap would become
    slot 3's, and the kernel's line for the same fault (by PCI address, slot 2) would no longer merge onto it."""
    c, clock, full, gone = _tray_short_of_gpu0(Store(engine))
    topo, tray = c.topology, TRAY
    assert topo is not None
    c.register_inventory(full)
    first = HealthEvent("nvml-xid", tray, EventKind.XID, clock.now(), code=13, source="nvml", attrs=(("gpu", "2"),))
    c.ingest([first])
    clock.advance(timedelta(seconds=2))
    c.register_inventory(gone)  # the node's agent restarted without GPU 0

    clock.advance(timedelta(seconds=2))
    other = make_engine(db_url)  # a new process
    try:
        again = Controller(Store(other), load_policy(), clock, topology=topo)
        line = HealthEvent("kmsg-xid", tray, EventKind.XID, first.time, code=13, source="kmsg",
                           attrs=(("pci", full.gpus[2].pci),))
        again.ingest([line])
        rows = {e.id: e for e in again.store.events(node=tray, kind="xid")}
        assert (rows["nvml-xid"].component, rows["kmsg-xid"].component) == (f"{tray}-gpu2", f"{tray}-gpu2")
        assert rows["kmsg-xid"].fault_of == "nvml-xid"  # the same fault, seen by two sources
    finally:
        other.dispose()


def test_a_node_put_back_in_service_short_of_a_gpu_is_not_told_again_at_each_agent_start(
    engine: Engine, tmp_path: Path,
) -> None:
    """A site that judges a missing GPU degraded: the node turns suspect, an operator who knows resumes it,
    and its agent's later starts do not make it suspect again for the same gap (0132's lesson); a second
    GPU gone is news. Before the operator's resume (the node in service all along) it is told each time."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[override]]\nkind = "gpu_lost"\nrule = "gpu_missing"\nseverity = "degraded"\n'
                      'action = "drain_and_inspect"\n')
    c, clock, full, gone = _tray_short_of_gpu0(Store(engine), load_policy(policy))
    c.register_inventory(full)
    c.sync({TRAY: SchedObservation(has_jobs=True, drained_empty=False)})  # a job runs there: drained at its checkpoint
    assert [e.kind for e in c.register_inventory(gone)] == [EventKind.GPU_LOST]
    assert c.engine.nodes[TRAY].state is NodeState.SUSPECT
    clock.advance(timedelta(minutes=5))
    assert [e.kind for e in c.register_inventory(gone)] == [EventKind.GPU_LOST]  # not put back yet: told again
    clock.advance(timedelta(minutes=5))
    c.operate(TRAY, OperatorOp.RESUME, "operator:ops-alice", "GPU 0 is out until Tuesday's window")
    assert c.engine.nodes[TRAY].state is NodeState.IN_SERVICE  # back with its job
    clock.advance(timedelta(hours=1))
    assert c.register_inventory(gone) == []  # its agent restarted: the same gap is no news
    assert c.engine.nodes[TRAY].state is NodeState.IN_SERVICE  # back with its job
    worse = replace(gone, gpus=gone.gpus[:2])  # and now the GPU of slot 3 is gone too
    assert [e.component for e in c.register_inventory(worse)] == [f"{TRAY}-gpu3"]


def test_a_revalidation_of_a_node_still_short_of_a_gpu_fails(engine: Engine) -> None:
    """The gap reported while the node was in repair (its agent registered before the node moved on)
    predates the revalidation, which counts only what comes after it: the controller tells it again once
    the node is in revalidation, and the revalidation fails on it."""
    c, clock, full, gone = _tray_short_of_gpu0(Store(engine))
    c.register_inventory(full)
    c.register_inventory(gone)
    c.sync({TRAY: SchedObservation(has_jobs=False, drained_empty=True)})
    assert c.engine.nodes[TRAY].state is NodeState.DRAINED
    clock.advance(timedelta(minutes=5))
    c.operate(TRAY, OperatorOp.RESUME, "operator:ops-alice", "reseated, try again")
    assert c.engine.nodes[TRAY].state is NodeState.REVALIDATE
    entered = c.engine.nodes[TRAY].since
    clock.advance(timedelta(seconds=1))
    c.tick()
    reports = c.store.events(node=TRAY, kind="gpu_lost")
    assert [(e.component, e.time > entered) for e in reports] == [(f"{TRAY}-gpu0", True), (f"{TRAY}-gpu0", False)]
    assert c.engine.nodes[TRAY].state is NodeState.REPAIR, c.engine.nodes[TRAY]
    (failed,) = [d for d in c.store.decisions(node=TRAY) if (d.from_state, d.to_state) == ("revalidate", "repair")]
    assert reports[0].id in [str(x) for x in failed.evidence]
    clock.advance(timedelta(seconds=1))
    c.tick()
    assert len(c.store.events(node=TRAY, kind="gpu_lost")) == 2  # told once, not at every pass


class _FailingSecond(Store):
    """The real store, except that the second inventory write fails."""

    writes = 0

    def save_inventory(self, inv: NodeInventory, now: datetime, reference: NodeInventory | None = None) -> None:
        self.writes += 1
        if self.writes == 2:
            raise OperationalError("UPDATE inventories", {}, Exception("server closed the connection"))
        super().save_inventory(inv, now, reference)


def test_a_failed_write_of_an_incomplete_inventory_keeps_the_reference(engine: Engine) -> None:
    c, _, full, gone = _tray_short_of_gpu0(_FailingSecond(engine))
    tray = TRAY
    c.register_inventory(full)
    with pytest.raises(ExternalError):
        c.register_inventory(gone)
    ref = c.identity.reference(tray)
    assert ref is not None and ref.inventory == full and c.store.inventory(tray) == full  # as was stored
    (lost,) = c.register_inventory(gone)  # the retry: the same gap, no moves
    assert (lost.kind, lost.component) == (EventKind.GPU_LOST, f"{tray}-gpu0")
    assert (c.store.load_inventories(), [r.inventory for r in c.store.load_references()]) == ([gone], [full])


def test_a_node_that_stayed_in_service_is_told_again_whatever_the_scheduler_did(engine: Engine, tmp_path: Path) -> None:
    """Judged informational (a site's choice) the gap leaves the node in service; a job placed on it since
    (the scheduler's move) is no putting back: each agent start says it again."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[override]]\nkind = "gpu_lost"\nrule = "gpu_missing"\nseverity = "info"\naction = "none"\n')
    c, clock, full, gone = _tray_short_of_gpu0(Store(engine), load_policy(policy))
    c.register_inventory(full)
    assert [e.kind for e in c.register_inventory(gone)] == [EventKind.GPU_LOST]
    clock.advance(timedelta(minutes=5))
    c.sync({TRAY: SchedObservation(has_jobs=True, drained_empty=False)})
    assert c.engine.nodes[TRAY].state is NodeState.IN_SERVICE
    clock.advance(timedelta(minutes=5))
    assert [e.kind for e in c.register_inventory(gone)] == [EventKind.GPU_LOST]


def test_a_revalidation_after_a_reboot_rung_waits_for_the_hosts_inventory(engine: Engine, tmp_path: Path) -> None:
    """The BMC says a power cycle is done at power on, before the host's agent registers: the gap known then
    is of before the repair, which may have brought the GPU back. The revalidation is not failed on it;
    the host's registration says what is there."""
    c, clock, full, _ = _in_repair_short_of_gpu0(Store(engine), tmp_path)
    clock.advance(timedelta(minutes=5))
    _rung_worked(c, clock, RepairStep.POWER_CYCLE, "power on")
    assert len(c.store.events(node=TRAY, kind="gpu_lost")) == 1 and c.engine.nodes[TRAY].state is NodeState.REVALIDATE
    clock.advance(timedelta(minutes=2))
    assert c.register_inventory(full) == []  # the host is back with every GPU
    c.tick()
    assert len(c.store.events(node=TRAY, kind="gpu_lost")) == 1 and c.engine.nodes[TRAY].state is NodeState.REVALIDATE


def test_a_reference_row_that_cannot_be_read_is_skipped(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(engine)
    inv = NodeInventory("r01-n01", "C1", (GpuUnit(0, serial="G0"),))
    store.save_inventory(inv, T0)
    with engine.begin() as conn:  # a reference in another shape (an inventory document alone)
        conn.execute(InventoryRow.__table__.update().values(reference=inv.to_json()))
    with caplog.at_level(logging.WARNING, logger="gpufleet.controller.store.repo"):
        assert store.load_references() == []
    assert "r01-n01" in caplog.text and "inventories.reference" in caplog.text


def test_a_host_back_from_a_reboot_rung_before_the_rung_is_recorded_still_fails_revalidation(
    engine: Engine, tmp_path: Path,
) -> None:
    """A rung is recorded when its outcome is seen: the rebooted host's agent registers (short of the GPU)
    before that. Its registration came during the repair, so the gap is not of before it: told again in
    revalidation, which fails on it."""
    c, clock, _, gone = _in_repair_short_of_gpu0(Store(engine), tmp_path)
    clock.advance(timedelta(minutes=3))
    c.register_inventory(gone)  # the host is back from the reboot, still without GPU 0
    clock.advance(timedelta(seconds=20))
    _rung_worked(c, clock, RepairStep.REBOOT, "host rebooted (boot id changed)")
    assert c.engine.nodes[TRAY].state is NodeState.REPAIR  # the revalidation failed on the gap, told again


def test_a_put_back_node_stays_quiet_however_many_jobs_ran_since(engine: Engine, tmp_path: Path) -> None:
    c, clock, gone = _put_back_short_of_gpu0(Store(engine), tmp_path)
    for busy in [False, True] * 260:  # 520 of the scheduler's moves since the operator's
        clock.advance(timedelta(seconds=1))
        c.sync({TRAY: SchedObservation(has_jobs=busy, drained_empty=False)})
    assert c.register_inventory(gone) == []


def test_a_gap_whose_reports_retention_deleted_is_not_told_again_to_a_node_in_service(
    engine: Engine, tmp_path: Path,
) -> None:
    """Put back knowingly more than a retention period ago: the reports that said when are gone, and the
    gap, lived with that long, is no news at the next agent start."""
    c, clock, gone = _put_back_short_of_gpu0(Store(engine), tmp_path)
    clock.advance(timedelta(days=8))
    with engine.begin() as conn:  # what retention deletes after its horizon (at least 7 days)
        conn.execute(EventRow.__table__.delete().where(EventRow.node == TRAY))
    assert c.register_inventory(gone) == []
    worse = replace(gone, gpus=gone.gpus[:2])  # a second GPU gone is news, as ever
    assert [e.component for e in c.register_inventory(worse)] == [f"{TRAY}-gpu3"]
