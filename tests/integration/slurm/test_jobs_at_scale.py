"""Jobs at scale on the real lab (docs/scale.md#jobs-at-scale), small: a few hundred queued jobs.

What the controller reads and holds must follow the jobs it asks about, not the queue: a reconciler
pass reads the running jobs' ids and nodes only, a job is looked up alone (``scontrol show job``), and
the whole queue, when something does list it, is streamed record by record. The 100,000-job run over
30 minutes is ``python -m bench jobs_scale``.
"""

from __future__ import annotations

import subprocess
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpufleet.schedulers.port import JobState, SchedNodeState
from gpufleet.schedulers.slurm import SlurmScheduler, SubprocessRunner
from gpufleet.schedulers.slurm.restd import RestReader
from gpufleet.schedulers.slurm.runner import CommandResult
from tests.integration.slurm.controller import LabController
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = pytest.mark.slurm

QUEUED = 300


class Recording(SubprocessRunner):
    """The real runner, noting each command and how many characters of output it handed over."""

    def __init__(self, lab: SlurmLab, chunk: int = 1 << 20) -> None:
        super().__init__(lab.slurm_conf, chunk=chunk)
        self.calls: list[tuple[tuple[str, ...], int]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        res = super().__call__(argv, timeout=timeout)
        self.calls.append((tuple(argv), len(res.stdout)))
        return res

    def stream(self, argv: Sequence[str], *, timeout: float) -> Iterator[str]:
        size = 0
        for chunk in super().stream(argv, timeout=timeout):
            size += len(chunk)
            yield chunk
        self.calls.append((tuple(argv), size))

    def since(self, n: int) -> list[tuple[tuple[str, ...], int]]:
        return self.calls[n:]


def _fill(lab: SlurmLab, count: int) -> list[str]:
    """``count`` held jobs (queued, never started), submitted by four sbatch loops at once."""
    loop = (f"for i in $(seq 1 {count // 4}); do sbatch --parsable -H -p low -J queued -o /dev/null "
            "--wrap true; done")
    procs = [subprocess.Popen(["bash", "-c", loop], env=lab.env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    ids = [line.split(";")[0] for p in procs for line in p.communicate(timeout=120)[0].split()]
    assert len(ids) == count // 4 * 4
    return ids


def _peak(call: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = call()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def queued(lab: SlurmLab) -> Iterator[list[str]]:
    ids = _fill(lab, QUEUED)
    yield ids
    lab.cmd("scancel", "--name=queued", check=False)


def test_a_job_read_alone_is_the_job_the_whole_queue_shows(lab: SlurmLab, sched: SlurmScheduler,
                                                             queued: list[str]) -> None:
    """One fact in one place: ``scontrol show job J`` (a lookup) and ``squeue --json`` (the queue) give the
    same Job for running, multi-node, pending, held, commented and oddly named jobs; slurmrestd's
    ``GET /job/{id}`` too."""
    a = lab.sbatch("n1", "sleep 300", "--comment", "run 7 gpufleet:signal=USR1 x|y Reason=no",
                   "-J", "name with spaces")
    b = lab.sbatch("n2,n3", "sleep 300", "-N", "2")
    wait_for(lambda: lab.job_state(a) == lab.job_state(b) == "RUNNING", "both jobs running")
    every = {j.id: j for j in sched.list_jobs()}
    assert {a, b, *queued} <= set(every)
    rest = SlurmScheduler(slurm_conf=lab.slurm_conf,
                          reader=RestReader(socket=str(lab.root / "run" / "slurmrestd.sock")))
    for job_id in (a, b, queued[0], queued[-1]):
        assert sched.job(job_id) == every[job_id], job_id
        assert rest.job(job_id) == every[job_id], job_id
    assert sched.job(a).checkpoint_signal == "USR1" and sched.job(a).name == "name with spaces"
    assert sched.job(b).nodes == ("n2", "n3") and sched.job(queued[0]).state == JobState.PENDING


def test_passes_and_lookups_read_what_they_name_and_the_queue_is_streamed(lab: SlurmLab,
                                                                          queued: list[str]) -> None:
    running = lab.sbatch("n1", "sleep 300")
    wait_for(lambda: lab.job_state(running) == "RUNNING", "job running")
    runner = Recording(lab, chunk=1 << 14)
    sched = SlurmScheduler(runner)
    whole = len(runner(["squeue", "--json"], timeout=30).stdout)  # the queue's document, for scale
    assert whole > QUEUED * 1000

    mark = len(runner.calls)
    nodes, pass_peak = _peak(lambda: sched.list_nodes(jobs=False))  # what every reconciler pass reads
    assert {n.name: n.state for n in nodes}["n1"] == SchedNodeState.ALLOCATED
    assert [argv[0] for argv, _ in runner.since(mark)] == ["sinfo"]  # no squeue: its cost follows the queue
    job, job_peak = _peak(lambda: sched.job(running))  # a checkpoint report's lookup
    on, on_peak = _peak(lambda: sched.jobs_on("n1"))  # acting on a node
    assert job.state == JobState.RUNNING and [j.id for j in on] == [running]
    read = runner.since(mark)
    assert ("squeue", "--json") not in [argv for argv, _ in read]
    assert sum(size for _, size in read) < whole / 20, read  # no read grows with the queue
    assert max(pass_peak, job_peak, on_peak) < whole / 5, (pass_peak, job_peak, on_peak, whole)

    found, list_peak = _peak(lambda: sched.find_jobs(lambda j: j.id == queued[-1]))
    assert [j.id for j in found] == [queued[-1]]
    assert list_peak < whole / 5, (list_peak, whole)  # streamed: the document is never held whole


def test_the_controller_never_reads_the_whole_queue_and_keeps_nothing_of_ended_jobs(
        lab: SlurmLab, queued: list[str], tmp_path: Path) -> None:
    """A controller syncing with a few hundred jobs queued, a running job reporting a checkpoint and asking
    for its events: no pass or request reads the queue (no squeue at all); once every job has ended,
    the controller's view of the scheduler holds the nodes and no job."""
    runner = Recording(lab)
    ctl = LabController.start(tmp_path, SlurmScheduler(runner), lab.nodes)
    try:
        job = lab.sbatch("n2", "sleep 300")
        wait_for(lambda: ctl.node_state("n2") == "in_service", "the controller sees the job on n2")
        r = ctl.agent.post(f"/jobs/{job}/checkpoint", json={"time": datetime.now(UTC).isoformat()})
        assert r.status_code == 202, r.text
        r = ctl.admin.get(f"/jobs/{job}/events")
        assert r.status_code == 200 and r.json()["nodes"] == ["n2"], r.text
        lab.cmd("scancel", job, *queued)
        wait_for(lambda: ctl.node_state("n2") == "ready", "the controller sees n2 empty again")
        reconciler = ctl.runtime.reconciler
        wait_for(lambda: not any(o.has_jobs for o in reconciler._seen.values()), "no job in the controller's view")
        assert set(reconciler._seen) == {*lab.nodes, "ghost"}  # one entry per node, whatever ran or queued
        # passes read sinfo; the report and the events read the job alone: no squeue at all
        assert not any(argv[0] == "squeue" for argv, _ in runner.calls), sorted({argv for argv, _ in runner.calls})
        assert any(argv[:3] == ("scontrol", "show", "job") for argv, _ in runner.calls)  # the lookups
    finally:
        ctl.stop()
