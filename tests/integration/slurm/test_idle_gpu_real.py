"""Idle-GPU detection on the real Slurm lab (issue #19 item 4): a job that holds GPUs and computes
nothing is reported by the agent, from the job's own processes (slurmstepd's environment) — here a
batch job that sets ``CUDA_VISIBLE_DEVICES`` and sleeps, on the agent's simulated (idle) GPUs."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.agent.clock import SystemClock
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.idlegpu import IdleGpus
from gpufleet.domain.events import EventKind, HealthEvent
from tests.integration.slurm.lab import SlurmLab, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.fleetops]


def test_a_job_holding_gpus_and_doing_nothing_is_reported(lab: SlurmLab) -> None:
    node = lab.nodes[0]
    job = lab.sbatch(node, "export CUDA_VISIBLE_DEVICES=1,3; exec sleep 300")
    try:
        wait_for(lambda: lab.job_state(job) == "RUNNING", f"job {job} running")
        clock = SystemClock()
        dev = SimDevice(4, clock=clock, load=0.0, seed=5)
        dev.open()
        idle = IdleGpus(node, timedelta(seconds=1), 15.0)  # the real /proc
        seen: list[HealthEvent] = []

        def reported() -> bool:
            util = {i: dev.read_fast(i).util_gpu_pct for i in range(4)}
            seen.extend(idle.observe(clock.now(), util))
            return any(e.attr("job") == job for e in seen)

        wait_for(reported, lambda: f"an idle GPU of job {job} reported; seen {[e.component for e in seen]}",
                 timeout=30, interval=0.5)
        mine = sorted(e.attr("gpu") for e in seen if e.attr("job") == job)
        assert mine == ["1", "3"]
        assert all(e.kind == EventKind.GPU_IDLE for e in seen)
    finally:
        lab.cmd("scancel", job, check=False)
    wait_for(lambda: lab.job_state(job) in ("CANCELLED", "COMPLETED", ""), f"job {job} gone")
    # the job's processes are gone: its GPUs are no longer held, the detector forgets them

    def forgotten() -> bool:
        idle.observe(clock.now(), dict.fromkeys(range(4), 0.0))
        return all(j != job for (_g, j) in idle.idle_seconds(clock.now()))

    wait_for(forgotten, f"job {job}'s GPUs forgotten", timeout=20, interval=0.5)
