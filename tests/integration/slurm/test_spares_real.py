"""Hot-spare pools on the real Slurm lab: a real controller (store, reconciler, HTTP API) moves nodes
between the lab's partitions (``high``: PriorityTier=10, the big job's; ``low``: PriorityTier=1,
PreemptMode=REQUEUE, the sweeps'; PreemptType=preempt/partition_prio) with ``scontrol update
partitionname=``; the sweep on the reclaimed spare is requeued by the controller.

n1 and n3 are behind leaf-a, n2 behind leaf-b: with one spare per leaf, n1 is the big partition's only
working node and n2, n3 are spares (the last idle node of each leaf). A controller SIGKILLed mid-reclaim:
tests/e2e/test_spares_crash.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.controller.settings import SparePoolSettings, SparesSettings
from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.hostlist import expand
from tests.integration.slurm.controller import ADMIN_TOKEN, LabController
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.fleetops]

LEAVES = {"n1": "leaf-a", "n2": "leaf-b", "n3": "leaf-a"}


def pools(**kw: Any) -> SparesSettings:
    return SparesSettings(pools=(SparePoolSettings(name="pretrain", count=1, big_partition="high",
                                                   backfill_partition="low", **kw),))


def pool(ctl: LabController) -> dict[str, Any]:
    out: dict[str, Any] = ctl.admin.get("/spares").json()[0]
    return out


def running_on(lab: SlurmLab, job: str) -> tuple[str, ...]:
    return expand(lab.cmd("squeue", "-h", "-j", job, "-t", "R", "-o", "%N", check=False).stdout.strip())


def restarts(lab: SlurmLab, job: str) -> int:
    out = lab.cmd("scontrol", "show", "job", job).stdout
    return int(next(t.split("=", 1)[1] for t in out.split() if t.startswith("Restarts=")))


def sbatch(lab: SlurmLab, partition: str, *extra: str) -> str:
    out = lab.cmd("sbatch", "--parsable", "-p", partition, "-N1", "--exclusive", "-J", partition, "-o",
                  str(lab.root / "jobs" / "%j.out"), *extra, "--wrap", "sleep 600").stdout
    return out.strip().split(";")[0]


def passes(ctl: LabController, n: int = 2) -> None:
    """Wait for ``n`` whole spares passes after now (instead of sleeping)."""
    for _ in range(n):
        mark = pool(ctl)["last_pass"]

        def moved(m: str = mark) -> bool:
            return bool(pool(ctl)["last_pass"] != m)

        wait_for(moved, "another spares pass", timeout=20)


def spares_up(lab: SlurmLab, ctl: LabController, high: set[str], low: set[str]) -> None:
    wait_for(lambda: lab.partition_nodes("high") == high and lab.partition_nodes("low") == low,
             lambda: f"high = {high}, low = {low}; slurm has high = {lab.partition_nodes('high')}, "
                     f"low = {lab.partition_nodes('low')}; pool: {pool(ctl)}", timeout=20)


def test_the_nearest_spare_is_reclaimed_from_its_sweep_when_the_big_jobs_node_fails_and_the_job_restarts_on_it(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    ctl = LabController.start(tmp_path, sched, lab.nodes, spares=pools(), leaves=LEAVES)
    try:
        spares_up(lab, ctl, high={"n1", "ghost"}, low={"n1", "n2", "n3", "ghost"})
        big = sbatch(lab, "high", "--comment", "pretrain")
        wait_for(lambda: running_on(lab, big) == ("n1",), f"the big job {big} on n1 (the only working node)")
        s2, s3 = sbatch(lab, "low", "-w", "n2"), sbatch(lab, "low", "-w", "n3")
        wait_for(lambda: running_on(lab, s2) == ("n2",) and running_on(lab, s3) == ("n3",), "sweeps on both spares")
        wait_for(lambda: pool(ctl)["totals"]["lent"] == 2, lambda: f"two spares lent: {pool(ctl)}")

        t0 = time.monotonic()
        ctl.post_event("n1", "xid", code=79, component="n1-gpu3", message="GPU has fallen off the bus")
        wait_for(lambda: "n3" in lab.partition_nodes("high"), lambda: f"n3 joins high: {pool(ctl)}")
        took = time.monotonic() - t0
        assert took < 10, f"reclaimed {took:.1f} s after the fault"
        assert "n3" not in lab.partition_nodes("low") and "n2" not in lab.partition_nodes("high")
        # (squeue shows a requeued job COMPLETING while its node cleans up, then PENDING)
        wait_for(lambda: lab.job_state(s3) == "PENDING", lambda: f"the sweep on n3 requeued: {lab.job_state(s3)}")
        assert restarts(lab, s3) == 1
        assert running_on(lab, s2) == ("n2",), "the sweep on the other leaf's spare goes on"
        audit = [a for a in ctl.audit("n3")[::-1] if a["action"].startswith("spare_")]
        assert [a["action"] for a in audit] == ["spare_designate", "spare_reclaim", "spare_reclaim_step",
                                                "spare_preempt", "spare_reclaimed"], audit
        assert f"preempted (requeued) {s3} of low" in audit[3]["detail"]
        st = pool(ctl)
        assert st["totals"] == {"target": 2, "ready": 0, "lent": 1, "reclaiming": 0, "reclaimed": 1}, st
        cli = subprocess.run([sys.executable, "-m", "gpufleet.cli", "spares", "--url",
                              ctl.url.removesuffix("/v1"), "status"], env={**lab.env, "GPUFLEET_TOKEN": ADMIN_TOKEN,
                                                                "COLUMNS": "120"},
                             capture_output=True, text=True, timeout=60, check=False)
        print(cli.stdout)  # (docs/spares.md shows this output)
        flat = " ".join(cli.stdout.replace("│", " ").split())
        assert cli.returncode == 0 and "0 ready, 1 lent, 0 reclaiming, 1 reclaimed of 2" in flat, cli.stderr + flat

        # the big job, requeued by n1's drain, restarts at full size on the reclaimed spare
        wait_for(lambda: lab.job_state(big) == "PENDING", f"the big job {big} requeued by n1's drain")
        sched.start_now(big)  # (Slurm holds a requeued job ~2 min; a resubmitted one starts at once)
        wait_for(lambda: running_on(lab, big) == ("n3",), lambda: f"the big job on n3: {lab.job_state(big)}")
    finally:
        ctl.stop()


def test_a_pool_never_lends_its_kept_spares(lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    ctl = LabController.start(tmp_path, sched, lab.nodes, spares=pools(keep_idle=1), leaves=LEAVES)
    try:
        spares_up(lab, ctl, high={"n1", "ghost"}, low={"n1", "ghost"})
        sweeps = [sbatch(lab, "low") for _ in range(3)]
        wait_for(lambda: any(running_on(lab, s) for s in sweeps), "a sweep running")
        passes(ctl)
        placed = [n for s in sweeps for n in running_on(lab, s)]
        assert placed == ["n1"], f"sweeps only on the working node, never on a kept spare: {placed}"
        assert pool(ctl)["totals"] == {"target": 2, "ready": 2, "lent": 0, "reclaiming": 0, "reclaimed": 0}
    finally:
        ctl.stop()
