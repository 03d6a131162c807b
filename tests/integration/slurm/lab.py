"""The real Slurm lab cluster for tests: ``scripts/slurm-lab.sh`` driven from Python.

One lab per pytest session (:func:`session_lab`, ``NODES`` slurmd), shared by the contract suite and the
integration tests; each test starts from :meth:`SlurmLab.reset` (no jobs, every real node idle and
undrained, no hooks or faults installed). A test that needs more nodes starts its own lab of any size
(:func:`start_lab`; the ``fleet_lab`` fixture: eight slurmd, one per test module). A lab lives in a temp
dir and gets its own port base so parallel labs (and sessions) on one machine do not collide.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "slurm-lab.sh"
NODES = 3  # the session's lab
FLEET_NODES = 8  # the fleet-operations lab (conftest.fleet_lab): a rollout of several batches


def slurm_installed() -> bool:
    return all(shutil.which(b) for b in ("slurmctld", "slurmd", "munged", "scontrol", "sbatch")) and os.geteuid() == 0


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port_base(nodes: int = NODES) -> int:
    """A base whose ports (slurmctld base+17, the ``nodes`` slurmd base+201.., the ghost base+299) are
    free; varies with the pid."""
    if not 1 <= nodes <= 98:  # slurm-lab.sh: slurmd n_i on base+200+i, below the ghost's base+299
        raise ValueError(f"a lab has 1 to 98 nodes, not {nodes}")
    start = 20000 + (os.getpid() % 90) * 300
    for i in range(90):
        base = 20000 + (start - 20000 + i * 300) % 27000
        if all(_port_free(base + off) for off in (17, *range(201, 201 + nodes), 299)):
            return base
    raise RuntimeError("no free port range for the Slurm lab")


def wait_for(check: Callable[[], bool], what: str | Callable[[], str], timeout: float = 40.0,
             interval: float = 0.1) -> None:
    """Poll ``check`` until it is true; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            text = what if isinstance(what, str) else what()
            pytest.fail(f"timed out after {timeout:g} s waiting for: {text}", pytrace=False)
        time.sleep(interval)


@dataclass
class SlurmLab:
    root: Path
    port_base: int
    nodes: list[str] = field(default_factory=lambda: [f"n{i}" for i in range(1, NODES + 1)])
    hc_interval: int = 5
    ghost: bool = True  # also declare "ghost", a node with no slurmd (a dead node in the cluster)
    max_jobs: int | None = None  # MaxJobCount (None: Slurm's default, 10,000)
    sched_params: str = ""  # extra SchedulerParameters, comma-separated

    @property
    def slurm_conf(self) -> str:
        return str(self.root / "etc" / "slurm.conf")

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_LAB": str(self.root), "SLURM_LAB_PORT_BASE": str(self.port_base),
                "SLURM_LAB_NODES": str(len(self.nodes)), "SLURM_LAB_HC_INTERVAL": str(self.hc_interval),
                "SLURM_LAB_GHOST": "1" if self.ghost else "0",
                "SLURM_LAB_MAX_JOBS": str(self.max_jobs or ""), "SLURM_LAB_SCHED_PARAMS": self.sched_params,
                "SLURM_CONF": self.slurm_conf}

    def script(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        proc = subprocess.run([str(SCRIPT), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"slurm-lab.sh {' '.join(args)} failed ({proc.returncode}): {proc.stderr}{proc.stdout}")
        return proc.stdout

    def up(self) -> None:
        self.script("up")

    def down(self) -> None:
        self.script("down", "--purge")

    def cmd(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def scontrol_show_node(self, node: str) -> str:
        return self.cmd("scontrol", "show", "node", node).stdout

    def sbatch(self, node: str, script: str = "sleep 600", *extra: str) -> str:
        out = self.cmd("sbatch", "--parsable", "-w", node, "-J", "lab", "-o", str(self.root / "jobs" / "%j.out"),
                       *extra, "--wrap", script).stdout
        return out.strip().split(";")[0]

    def job_output(self, job_id: str) -> str:
        path = self.root / "jobs" / f"{job_id}.out"
        return path.read_text() if path.exists() else ""

    def job_state(self, job_id: str, field: str = "JobState") -> str:
        out = self.cmd("scontrol", "show", "job", job_id, check=False).stdout
        for tok in out.split():
            if tok.startswith(f"{field}="):
                return tok.split("=", 1)[1]
        return ""

    def lift_requeue_hold(self, job_id: str) -> None:
        """Slurm holds a requeued job back for about two minutes (its begin time): make it eligible now.
        Only once it is pending: an update while it still completes is accepted, then lost."""
        wait_for(lambda: self.job_state(job_id) == "PENDING", lambda: f"job {job_id} pending: {self.job_state(job_id)}")
        self.cmd("scontrol", "update", f"jobid={job_id}", "starttime=now")
        wait_for(lambda: self.job_state(job_id, "Reason") != "BeginTime", f"job {job_id} no longer held (BeginTime)")

    def wait_saved(self, what: str, since: float) -> None:
        """Wait until slurmctld has written its ``<what>_state`` file (job, node) after ``since``.

        slurmctld saves state lazily (seconds after a change); a SIGKILL before that loses the change.
        Tests that crash slurmctld on purpose call this first when they need the change to survive."""
        path = self.root / "state" / f"{what}_state"
        wait_for(lambda: path.exists() and path.stat().st_mtime >= since, f"slurmctld saved {path.name}")

    def wait_job_saved(self, job: str) -> None:
        """Wait until slurmctld's saved job state includes ``job`` as it is now.

        Waiting for a save after "now" alone races: slurmctld may have saved the change just before,
        and then nothing makes it save again. An admin comment on the job is a change after now, so
        the save that follows it surely contains everything before it."""
        mark = time.time()
        self.cmd("scontrol", "update", f"JobId={job}", "Comment=gpufleet-lab-save")
        self.wait_saved("job", mark)

    def hook(self, name: str, body: str, node: str | None = None) -> Path:
        """Install an executable hook (prolog, epilog, healthcheck), for one node or all."""
        path = self.root / "hooks" / (f"{name}.{node}" if node else name)
        path.write_text(body)
        path.chmod(0o755)
        return path

    def reset(self) -> None:
        """No jobs, no hooks, no faults, no reservations, the partitions as slurm.conf has them; every real
        node idle and undrained (slurmctld restarted if a failed test left it down). A controller a test
        SIGKILLed mid-validation leaves its ``flags=maint`` reservation behind, and a node in one shows
        ``maint``, not ``idle``."""
        self.script("ctld-start")
        topo, default = self.root / "etc" / "topology.conf", self.root / "etc" / "topology.conf.default"
        if default.exists() and topo.read_text() != default.read_text():  # a test placed its own switches
            topo.write_text(default.read_text())
            self.cmd("scontrol", "reconfigure")
        for d in ("hooks", "faults"):
            for p in (self.root / d).iterdir():
                p.unlink()
        ids = self.cmd("squeue", "-h", "-o", "%i", check=False).stdout.split()
        if ids:
            self.cmd("scancel", *ids, check=False)
        for n in self.nodes:
            self.cmd("scontrol", "update", f"nodename={n}", "state=resume", check=False)
        shown = self.cmd("scontrol", "-o", "show", "reservation", check=False).stdout
        for name in re.findall(r"ReservationName=(\S+)", shown):
            self.cmd("scontrol", "delete", f"reservationname={name}", check=False)
        every = ",".join([*self.nodes, *(["ghost"] if self.ghost else [])])
        for part in ("low", "high"):  # a hot-spare pool test moved nodes between them
            if self.partition_nodes(part) != set(every.split(",")):
                self.cmd("scontrol", "update", f"partitionname={part}", f"nodes={every}")
        wait_for(lambda: not self.cmd("squeue", "-h", "-t", "R,CG,CF,PD", check=False).stdout.strip(),
                 "all lab jobs gone")
        # a validation reservation a test's controller left behind keeps its node MAINT (never "idle")
        for line in self.cmd("scontrol", "show", "reservation", "-o", check=False).stdout.splitlines():
            name = next((t.split("=", 1)[1] for t in line.split() if t.startswith("ReservationName=")), "")
            if name:
                self.cmd("scontrol", "delete", f"reservationname={name}", check=False)
        wait_for(self._all_idle, lambda: "all lab nodes idle and undrained; sinfo says: " + self.cmd(
            "sinfo", "-h", "-N", "-n", ",".join(self.nodes), "-o", "%N %T %E", check=False).stdout.strip())

    def partition_nodes(self, partition: str) -> set[str]:
        """The partition's nodes as slurmctld has them now (``scontrol show partition``)."""
        from gpufleet.schedulers.slurm.hostlist import expand

        out = self.cmd("scontrol", "show", "partition", partition, "-o").stdout
        nodes = next((t.split("=", 1)[1] for t in out.split() if t.startswith("Nodes=")), "")
        return set(expand(nodes)) if nodes and nodes != "(null)" else set()

    def _all_idle(self) -> bool:
        out = self.cmd("sinfo", "-h", "-N", "-n", ",".join(self.nodes), "-o", "%N %T", check=False).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(n, "").rstrip("*") == "idle" for n in self.nodes)


_LAB: SlurmLab | None = None


def start_lab(nodes: int = NODES, *, ghost: bool = True) -> SlurmLab:
    """A new lab of ``nodes`` slurmd (n1..nN) in its own temp dir, on free ports, up; the caller tears
    it down with :meth:`SlurmLab.down` (every daemon and job process by PID, the dir removed). Skips
    (locally) or fails (in CI) without a real Slurm."""
    from tests.conftest import require_service

    require_service(slurm_installed(), "a real Slurm (slurmctld, slurmd, munged; run as root)")
    root = Path(tempfile.mkdtemp(prefix="gpufleet-slurm-"))
    lab = SlurmLab(root=root, port_base=pick_port_base(nodes), nodes=[f"n{i}" for i in range(1, nodes + 1)],
                   ghost=ghost)
    try:
        lab.up()
    except Exception:
        lab.down()
        raise
    return lab


def session_lab(request: pytest.FixtureRequest) -> SlurmLab:
    """The session's lab, started on first use and torn down (by PID) when the session ends."""
    global _LAB
    if _LAB is None:
        lab = start_lab()
        request.config.add_cleanup(lab.down)
        _LAB = lab
    return _LAB
