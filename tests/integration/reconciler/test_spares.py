"""Hot-spare pools inside the controller: real store, real lifecycle engine and audit log; Slurm played by
an in-memory lever (partitions, running jobs, requeues) so every step and a stop between any two can
be checked in milliseconds. (On the real Slurm lab: tests/integration/slurm/test_spares_real.py.)"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from gpufleet.cli.spares import _pools
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.settings import ControllerSettings, load_settings
from gpufleet.controller.spares import PartitionLever, Spares
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.domain.fleet import Nic, Node
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.engine import OperatorOp
from gpufleet.lifecycle.maintenance import Selector
from gpufleet.lifecycle.spares import PoolSpec
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.port import Job, JobState
from gpufleet.schedulers.slurm.parse import SlurmNode

T0 = datetime(2026, 11, 26, 12, tzinfo=UTC)
POLICY = {"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0}}
LEAVES = {"n1": "a", "n2": "b", "n3": "a", "n4": "b"}
POOL = PoolSpec("pretrain", "high", "low", Selector("all"), "switch", count=1)


@dataclass
class FakeSlurm:
    """Partitions and running jobs, as scontrol/squeue would show them; counts every write."""

    partitions: dict[str, set[str]] = field(default_factory=lambda: {"high": set(LEAVES), "low": set(LEAVES)})
    jobs: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (node, partition), running
    requeued: list[str] = field(default_factory=list)
    writes: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    fail_write: str = ""  # a partition whose next write fails (a controller stopped mid-reclaim)

    def slurm_nodes(self) -> list[SlurmNode]:
        busy = {n for n, _ in self.jobs.values()}
        return [SlurmNode(n, "allocated" if n in busy else "idle", (),
                          partitions=tuple(p for p, ms in sorted(self.partitions.items()) if n in ms))
                for n in sorted(LEAVES)]

    def jobs_on(self, node: str) -> Sequence[Job]:
        return [Job(j, "sweep", JobState.RUNNING, (n,), extra=(("partition", p),))
                for j, (n, p) in self.jobs.items() if n == node]

    def requeue(self, job_id: str) -> None:
        self.requeued.append(job_id)
        self.jobs.pop(job_id, None)

    def set_partition_nodes(self, partition: str, nodes: Sequence[str]) -> None:
        if partition == self.fail_write:
            self.fail_write = ""
            raise ExternalError("slurm", "controller unreachable: slurmctld stopped")
        self.partitions[partition] = set(nodes)
        self.writes.append((partition, tuple(nodes)))


class World:
    def __init__(self, tmp: Path) -> None:
        self.url = f"sqlite:///{tmp / 'c.db'}"
        self.slurm = FakeSlurm()
        self.restart()
        self.c.register([Node(n, "r1", nics=(Nic("nic0", 0, f"s-{n}", leaf=leaf),)) for n, leaf in LEAVES.items()],
                        state=NodeState.READY)

    def restart(self) -> None:
        engine = make_engine(self.url)
        migrate(engine)
        self.c = Controller(Store(engine), parse_policy(POLICY), ManualClock(T0))
        self.s = Spares(self.c, self.slurm, [POOL])

    def audit(self, action: str) -> list[str]:
        return [f"{a.target}: {a.detail}" for a in self.c.store.audit(page=Page(limit=500)) if a.action == action]


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


def test_spares_leave_the_big_partition_and_are_lent_then_the_nearest_is_reclaimed_for_a_failure(w: World) -> None:
    assert isinstance(w.slurm, PartitionLever)
    w.s.on_pass()
    assert w.slurm.partitions == {"high": {"n1", "n2"}, "low": {"n1", "n2", "n3", "n4"}}
    assert sorted(w.audit("spare_designate")) == [
        "n3: hot spare of switch:a: out of high, lent to low while idle",
        "n4: hot spare of switch:b: out of high, lent to low while idle"]
    w.slurm.jobs = {"101": ("n3", "low"), "102": ("n4", "low")}
    w.s.on_pass()
    assert w.s.status()[0]["totals"] == {"target": 2, "ready": 0, "lent": 2, "reclaiming": 0, "reclaimed": 0}

    w.c.operate("n1", OperatorOp.DRAIN, "test", "xid 79")  # the big job's node on leaf a fails
    writes = len(w.slurm.writes)
    w.s.on_pass()
    assert w.slurm.requeued == ["101"], "the sweep on n3 (leaf a, like n1) is preempted; n4's is not"
    assert w.slurm.partitions == {"high": {"n1", "n2", "n3"}, "low": {"n1", "n2", "n4"}}
    assert w.slurm.writes[writes:] == [("low", ("n1", "n2", "n4")), ("high", ("n1", "n2", "n3"))]
    assert [a.split(":")[0] for a in w.audit("spare_reclaim")] == ["n3"]
    st = w.s.status()[0]
    assert st["totals"]["reclaimed"] == 1 and st["totals"]["lent"] == 1
    assert {n["node"]: (n["role"], n["replaces"]) for n in st["nodes"]} == {
        "n3": ("reclaimed", "n1"), "n4": ("spare", "")}
    w.s.on_pass()
    assert w.slurm.requeued == ["101"] and len(w.slurm.writes) == writes + 2, "a settled pool writes nothing"

    console = Console(record=True, width=200)  # what `gpufleet spares status` prints of the API's document
    console.print(_pools(json.loads(json.dumps(w.s.status()))))
    flat = " ".join(console.export_text().replace("│", " ").split())
    assert "0 ready, 1 lent, 0 reclaiming, 1 reclaimed of 2" in flat and "n3 reclaimed n1 joined" in flat, flat


def test_a_controller_stopped_mid_reclaim_resumes_and_does_nothing_twice(w: World) -> None:
    w.s.on_pass()
    w.slurm.jobs = {"101": ("n3", "low")}
    w.c.operate("n1", OperatorOp.DRAIN, "test", "xid 79")
    w.slurm.fail_write = "high"  # the sweep is requeued, then joining the big partition fails: stop here
    w.s.on_pass()
    assert w.slurm.requeued == ["101"] and "n3" not in w.slurm.partitions["high"]
    assert {n["node"]: n["step"] for n in w.s.status()[0]["nodes"]}["n3"] == "requeued"

    w.slurm.jobs = {"101": ("n4", "low")}  # the requeued sweep restarted elsewhere meanwhile
    w.restart()  # a new process on the same database
    w.s.on_pass()
    assert w.slurm.requeued == ["101"], "not requeued a second time"
    assert "n3" in w.slurm.partitions["high"] and "n3" not in w.slurm.partitions["low"]
    assert len(w.audit("spare_preempt")) == 1 and len(w.audit("spare_reclaimed")) == 1


def test_keep_idle_spares_are_never_lent_and_reconfigure_drift_is_set_back(w: World) -> None:
    w.s = Spares(w.c, w.slurm, [PoolSpec("p", "high", "low", Selector("all"), "switch", count=1, keep_idle=1)])
    w.s.on_pass()
    assert w.slurm.partitions == {"high": {"n1", "n2"}, "low": {"n1", "n2"}}, "the last spare of each leaf is kept"
    w.slurm.partitions = {"high": set(LEAVES), "low": set(LEAVES)}  # scontrol reconfigure: slurm.conf wins
    w.s.on_pass()
    assert w.slurm.partitions == {"high": {"n1", "n2"}, "low": {"n1", "n2"}}


def test_an_unreadable_scheduler_moves_nothing(w: World) -> None:
    def down() -> list[SlurmNode]:
        raise ExternalError("slurm", "controller unreachable")

    w.slurm.slurm_nodes = down  # type: ignore[method-assign]
    w.s.on_pass()
    assert not w.slurm.writes and "scheduler unreadable" in w.s.status()[0]["note"]


def test_pools_in_the_settings_are_checked_and_name_the_bad_field(tmp_path: Path) -> None:
    good = ('scheduler = "slurm"\n[[spares.pools]]\nname = "p"\ncount = 1\nbig_partition = "high"\n'
            'backfill_partition = "low"\n')
    (tmp_path / "c.toml").write_text(good)
    s: ControllerSettings = load_settings(tmp_path / "c.toml")
    assert s.spares.pools[0].spec() == PoolSpec("p", "high", "low", count=1)
    (tmp_path / "c.toml").write_text(good.replace("count = 1", "count = 1\nshare = 0.1"))
    with pytest.raises(InvalidInput) as err:
        load_settings(tmp_path / "c.toml")
    assert err.value.field == "spares.pools.0" and "exactly one of count" in str(err.value)
    (tmp_path / "c.toml").write_text(good.replace('"low"', '"high"'))
    with pytest.raises(InvalidInput, match="a partition other than the big partition"):
        load_settings(tmp_path / "c.toml")
