"""agent/idlegpu.py: GPUs allocated to a Slurm job (read from its processes' environment) that stay idle
past the threshold are reported once, as info; the agent's slow tick runs it and exports the idle time."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.exporter import make_registry
from gpufleet.agent.idlegpu import IdleGpus, allocations
from gpufleet.agent.runner import Agent, Cadence
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import judge_event


def proc(tmp_path: Path, envs: dict[str, dict[str, str]]) -> Path:
    root = tmp_path / "proc"
    for pid, env in envs.items():
        d = root / pid
        d.mkdir(parents=True)
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    (root / "self").mkdir(parents=True, exist_ok=True)  # not a pid: ignored
    return root


JOBS = {
    "100": {"PATH": "/usr/bin", "SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,2", "CUDA_VISIBLE_DEVICES": "0,1"},
    "101": {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,2"},  # another process of the same job
    "200": {"SLURM_JOB_ID": "43", "CUDA_VISIBLE_DEVICES": "1"},  # no GRES variable: CUDA_VISIBLE_DEVICES
    "300": {"SLURM_JOB_ID": "44", "CUDA_VISIBLE_DEVICES": "GPU-8a3c,GPU-77f1"},  # UUIDs: not guessed
    "400": {"CUDA_VISIBLE_DEVICES": "3"},  # not a Slurm job
}


def test_allocations_come_from_the_jobs_processes(tmp_path: Path) -> None:
    assert allocations(proc(tmp_path, JOBS)) == {0: "42", 2: "42", 1: "43"}
    assert allocations(tmp_path / "no-proc") == {}


def test_an_allocated_gpu_idle_past_the_threshold_is_reported_once_and_rearms(tmp_path: Path) -> None:
    clock = FakeClock()
    idle = IdleGpus("r01-n01", timedelta(minutes=30), 5.0, proc(tmp_path, JOBS))
    t0 = clock.now()
    busy1 = {0: 0.0, 1: 80.0, 2: 3.0, 3: 0.0}
    assert idle.observe(t0, busy1) == []
    assert idle.observe(t0 + timedelta(minutes=29), busy1) == []
    found = idle.observe(t0 + timedelta(minutes=30), busy1)
    assert sorted((e.component, e.attr("job")) for e in found) == [("r01-n01-gpu0", "42"), ("r01-n01-gpu2", "42")]
    e = found[0]
    assert e.kind == EventKind.GPU_IDLE and e.attr("rule") == "gpu_idle" and e.attr("idle_s") == "1800"
    assert judge_event(load_default_catalog(), e).severity == Severity.INFO  # usage, never a drain
    assert idle.observe(t0 + timedelta(minutes=31), busy1) == []  # once
    # GPU 0 works, then idles again: a new report after another full threshold
    assert idle.observe(t0 + timedelta(minutes=32), {0: 90.0, 2: 1.0}) == []
    assert idle.observe(t0 + timedelta(minutes=33), {0: 0.0, 2: 1.0}) == []
    again = idle.observe(t0 + timedelta(minutes=63), {0: 0.0, 2: 1.0})
    assert [x.component for x in again] == ["r01-n01-gpu0"] and again[0].id != e.id
    assert idle.idle_seconds(t0 + timedelta(minutes=63))[(0, "42")] == 30 * 60


def test_a_job_that_ends_rearms_its_gpus(tmp_path: Path) -> None:
    clock = FakeClock()
    idle = IdleGpus("n1", timedelta(minutes=10), 5.0, tmp_path)
    t0 = clock.now()
    assert idle.observe(t0, {0: 0.0}, {0: "7"}) == []
    assert idle.observe(t0 + timedelta(minutes=5), {0: 0.0}, {}) == []  # job 7 ended
    assert idle.observe(t0 + timedelta(minutes=12), {0: 0.0}, {0: "8"}) == []  # job 8 starts its own clock
    assert [e.attr("job") for e in idle.observe(t0 + timedelta(minutes=22), {0: 0.0}, {0: "8"})] == ["8"]


@pytest.mark.parametrize(("after", "util", "field"), [(timedelta(0), 5.0, "idle_gpu_after_s"),
                                                      (timedelta(minutes=1), 100.0, "idle_gpu_max_util_pct")])
def test_bad_settings_are_named(after: timedelta, util: float, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        IdleGpus("n1", after, util)
    assert err.value.field == field


@pytest.mark.parametrize(("load", "reported"), [(0.0, ["n1-gpu0", "n1-gpu1", "n1-gpu2"]), (60.0, [])])
def test_the_agents_slow_tick_reports_idle_allocated_gpus_and_exports_the_idle_time(
        tmp_path: Path, load: float, reported: list[str]) -> None:
    clock = FakeClock()
    dev = SimDevice(4, clock=clock, load=load, seed=3)
    seen: list[HealthEvent] = []
    agent = Agent("n1", dev, clock, cadence=Cadence(fast_s=1, slow_s=30),
                  idle=IdleGpus("n1", timedelta(minutes=2), 15.0, proc(tmp_path, JOBS)),
                  on_events=seen.extend)
    agent.open()
    for _ in range(200):  # 200 s of ticks
        agent.tick()
        clock.advance(1.0)
    idle = [e for e in seen if e.kind == EventKind.GPU_IDLE]
    assert sorted(e.component for e in idle) == reported
    pci = {g.index: g.pci_bus_id for g in dev.gpus()}
    assert all(e.attr("pci") == pci[int(e.attr("gpu"))] and e.source == "nvml" for e in idle)
    samples = [smp for m in make_registry(agent.telemetry).collect() if m.name == "gpufleet_gpu_idle_seconds"
               for smp in m.samples]
    assert sorted((smp.labels["gpu"], smp.labels["job"]) for smp in samples if smp.value >= 120) == (
        [("0", "42"), ("1", "43"), ("2", "42")] if reported else [])
