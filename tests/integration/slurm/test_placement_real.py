"""Placement on the real Slurm lab: slurmctld loads the topology.conf `gpufleet slurm topology-conf`
writes (topology/tree) and places a job by it; a suspect node is placed last (its weight), set again
after `scontrol reconfigure` forgets it, and placed normally once it is cleared."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology import Component, Link, Topology, dump_topology
from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.hostlist import expand
from gpufleet.schedulers.slurm.parse import PLACE_LAST_WEIGHT
from tests.integration.slurm.controller import LabController
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.fleetops]

# n1 and n3 share a leaf, n2 is alone on another: Slurm's own order (n1, n2, ...) would pick n[1-2] for
# a two-node job; a job asking for one switch can only get n[1,3].
LEAVES = {"n1": "leaf-a", "n2": "leaf-b", "n3": "leaf-a"}


def _topology(path: Path) -> Path:
    comps = [Component(n, K.NODE) for n in LEAVES]
    comps += [Component(f"{n}-nic0", K.NIC, parent=n) for n in LEAVES]
    comps += [Component(s, K.LEAF_SWITCH) for s in sorted(set(LEAVES.values()))]
    comps.append(Component("spine-1", K.SPINE_SWITCH))
    links = [Link(f"{n}-nic0~{leaf}", "ib", f"{n}-nic0", leaf) for n, leaf in LEAVES.items()]
    links += [Link(f"{leaf}~spine-1", "ib", leaf, "spine-1") for leaf in sorted(set(LEAVES.values()))]
    path.write_text(dump_topology(Topology.of(comps, links)))
    return path


def _cli(lab: SlurmLab, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpufleet.cli", "slurm", "topology-conf", *args,
                           "--slurm-conf", lab.slurm_conf], env=lab.env, capture_output=True, text=True,
                          timeout=60, check=False)


def _shown(lab: SlurmLab) -> dict[str, dict[str, str]]:
    """``scontrol show topology``: switch name -> its fields (Level, Nodes = every node below it, Switches)."""
    out: dict[str, dict[str, str]] = {}
    for line in lab.cmd("scontrol", "show", "topology").stdout.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "SwitchName" in fields:
            out[fields["SwitchName"]] = fields
    return out


def test_slurmctld_loads_the_generated_tree_and_places_a_one_switch_job_by_it(lab: SlurmLab, tmp_path: Path) -> None:
    conf = Path(lab.slurm_conf).with_name("topology.conf")
    res = _cli(lab, "--topology", str(_topology(tmp_path / "lab.json")), "--out", str(conf), "--reconfigure")
    assert res.returncode == 0, res.stderr
    assert "written (3 switches)" in res.stderr and "reconfigure" in res.stderr

    wait_for(lambda: _shown(lab).keys() >= {"leaf-a", "leaf-b", "spine-1"},
             lambda: f"the new switches in `scontrol show topology`: {_shown(lab)}")
    shown = _shown(lab)
    assert set(expand(shown["leaf-a"]["Nodes"])) == {"n1", "n3"}
    assert set(expand(shown["leaf-b"]["Nodes"])) == {"n2"}
    assert shown["spine-1"]["Switches"].split(",") == ["leaf-a", "leaf-b"]
    assert shown["spine-1"]["Level"] == "1" and shown["leaf-a"]["Level"] == "0"

    job = lab.cmd("sbatch", "--parsable", "-N2", "--switches=1", "-J", "placed", "-o",
                  str(lab.root / "jobs" / "%j.out"), "--wrap", "sleep 600").stdout.strip().split(";")[0]

    def nodes_of_job() -> str:
        out = lab.cmd("squeue", "-h", "-j", job, "-t", "R", "-o", "%N", check=False).stdout.strip()
        return out

    wait_for(lambda: bool(nodes_of_job()), lambda: f"job {job} running: {lab.cmd('squeue', '-h', '-j', job).stdout}")
    assert set(expand(nodes_of_job())) == {"n1", "n3"}

    again = _cli(lab, "--topology", str(tmp_path / "lab.json"), "--out", str(conf), "--reconfigure")
    assert again.returncode == 0 and "unchanged" in again.stderr and "reconfigure" not in again.stderr


def _running_on(lab: SlurmLab, job: str) -> str:
    return lab.cmd("squeue", "-h", "-j", job, "-t", "R", "-o", "%N", check=False).stdout.strip()


def test_a_suspect_is_placed_last_by_its_weight_even_after_a_reconfigure(
        lab: SlurmLab, sched: SlurmScheduler, tmp_path: Path) -> None:
    ctl = LabController.start(tmp_path, sched, lab.nodes)
    try:
        base = sched.slurm_node("n1").weight
        lab.sbatch("n1")  # a job that never checkpoints: n1 stays suspect until the 10 min deadline
        wait_for(lambda: ctl.node_state("n1") == "in_service", "the controller sees the job on n1")
        ctl.post_event("n1", "xid", code=94, component="n1-gpu2", message="contained ECC error")
        wait_for(lambda: ctl.node_state("n1") == "suspect", "n1 suspect")
        wait_for(lambda: sched.slurm_node("n1").weight == base + PLACE_LAST_WEIGHT,
                 lambda: f"n1's weight raised: {sched.slurm_node('n1').weight}")
        assert sched.node("n1").placed_last and not sched.node("n2").placed_last
        assert "DRAIN" not in sched.slurm_node("n1").flags  # still schedulable: kept last, not drained

        # n1 still has a free CPU, but a new one-CPU job goes to a node of normal weight
        job = lab.cmd("sbatch", "--parsable", "-N1", "-n1", "-J", "new", "-o", str(lab.root / "jobs" / "%j.out"),
                      "--wrap", "sleep 600").stdout.strip().split(";")[0]
        wait_for(lambda: bool(_running_on(lab, job)), f"job {job} running")
        assert _running_on(lab, job) != "n1"

        lab.cmd("scontrol", "reconfigure")  # Slurm forgets weights set with scontrol...
        wait_for(lambda: sum(a["action"] == "place_last" for a in ctl.audit("n1")) == 2,
                 lambda: f"the controller raising n1's weight again: {ctl.audit('n1')[:4]}")
        assert sched.slurm_node("n1").weight == base + PLACE_LAST_WEIGHT  # ...the controller sets it again

        r = ctl.admin.post("/nodes/n1/resume", json={"reason": "ECC counters checked: false alarm"})
        r.raise_for_status()
        wait_for(lambda: sched.slurm_node("n1").weight == base,
                 lambda: f"n1's weight back to {base}: {sched.slurm_node('n1').weight}")
        assert not sched.node("n1").placed_last
    finally:
        ctl.stop()
