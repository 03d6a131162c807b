"""Crash safety of a hot-spare reclaim on the real Slurm lab: a real ``gpufleet controller serve`` is
SIGKILLed right after Slurm requeued the sweep on the spare and before the controller recorded it (a
``scontrol`` on the PATH runs the real requeue, then hangs); the restarted controller resumes the reclaim
from the store: the sweep is not requeued a second time, the spare joins the big partition.

(The pools' other behaviour on the lab: tests/integration/slurm/test_spares_real.py.)"""

from __future__ import annotations

import os
import shutil
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpufleet.controller.store.db import make_engine
from gpufleet.controller.store.repo import Store
from gpufleet.controller.store.spares import SpareStore
from tests.e2e.harness import Controller, Fleet, wait_until
from tests.integration.slurm.lab import SlurmLab
from tests.integration.slurm.test_spares_real import restarts, running_on, sbatch

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.fleetops]

POOL = """
[[spares.pools]]
name = "pretrain"
count = 1
big_partition = "high"
backfill_partition = "low"
"""
LEAVES = {"n1": ["leaf-a"], "n2": ["leaf-b"], "n3": ["leaf-a"]}


def hanging_requeue(bindir: Path, block: Path, mark: Path) -> None:
    """``scontrol`` that runs the real command, and for ``requeue <the job in block>`` then hangs."""
    real = shutil.which("scontrol")
    bindir.mkdir()
    wrapper = bindir / "scontrol"
    wrapper.write_text(f"""#!/bin/sh
if [ "$1" = requeue ] && [ -e {block} ] && [ "$2" = "$(cat {block})" ]; then
  {real} "$@"
  echo $$ > {mark}
  exec sleep 600
fi
exec {real} "$@"
""")
    wrapper.chmod(0o755)


def pool(ctl: Controller) -> dict[str, Any]:
    out: dict[str, Any] = ctl.api.get("/spares")[0]
    return out


def test_sigkill_between_the_sweeps_requeue_and_its_record_requeues_nothing_twice(
        fleet: Fleet, slurm_lab: SlurmLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lab = slurm_lab
    block, mark = tmp_path / "block", tmp_path / "hung"
    hanging_requeue(tmp_path / "bin", block, mark)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    ctl = fleet.controller(nodes=["n1", "n2", "n3"], scheduler="slurm", slurm_conf=lab.slurm_conf,
                           extra_config=POOL, leaves=LEAVES)
    wait_until(lambda: lab.partition_nodes("high") == {"n1", "ghost"}, lambda: f"spares out of high: {pool(ctl)}")
    sweep = sbatch(lab, "low", "-w", "n3")
    wait_until(lambda: running_on(lab, sweep) == ("n3",), "the sweep on the spare n3")
    block.write_text(sweep)

    now = datetime.now(UTC).isoformat()
    ctl.api.post("/events", {"events": [{"id": "spares-crash-1", "node": "n1", "kind": "xid", "time": now, "code": 79,
                                         "component": "n1-gpu3", "message": "GPU has fallen off the bus"}]})
    wait_until(mark.exists, lambda: f"the controller requeueing the sweep: {pool(ctl)}", 30)
    wait_until(lambda: lab.job_state(sweep) == "PENDING", "Slurm requeued the sweep")
    fleet.kill_controller()
    os.kill(int(mark.read_text()), signal.SIGKILL)  # the hung scontrol
    held = SpareStore(Store(make_engine(f"sqlite:///{ctl.root / 'controller.db'}"))).get("n3")
    assert held is not None and held.step == "backfill_left", "killed after the requeue, before its record"
    block.unlink()
    fleet.restart_controller()

    wait_until(lambda: "n3" in lab.partition_nodes("high"), lambda: f"n3 joins high: {pool(ctl)}", 30)
    assert "n3" not in lab.partition_nodes("low")
    assert restarts(lab, sweep) == 1, "the sweep was requeued once"
    actions = [a["action"] for a in ctl.api.get("/audit", target="n3")]
    assert actions.count("spare_reclaim") == 1 and actions.count("spare_preempt") == 1, actions
    assert pool(ctl)["totals"]["reclaimed"] == 1

