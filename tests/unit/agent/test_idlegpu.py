"""agent/idlegpu.py: GPUs allocated to a Slurm job (read from its processes' environment) that stay idle
past the threshold are reported once, as info, with the memory they held and the job's owner; the agent's
slow tick runs it and exports the idle time labelled with the owner."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.config import load_config
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.exporter import make_registry
from gpufleet.agent.idlegpu import Allocation, IdleGpus, allocations, user_name
from gpufleet.agent.runner import Agent, Cadence
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import judge_event
from tests.conftest import require_service


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
    me = user_name(os.geteuid())  # the test made the process directories: their owner is whoever runs it
    assert allocations(proc(tmp_path, JOBS)) == {0: Allocation("42", me), 2: Allocation("42", me),
                                                 1: Allocation("43", me)}
    assert allocations(tmp_path / "no-proc") == {}


def test_the_owner_is_the_user_the_jobs_processes_run_as_not_root(tmp_path: Path) -> None:
    """A root process that inherited a job's environment (a site helper) does not name the owner when a
    process of the job runs as a user; a uid without a passwd entry is named by its number."""
    # giving the process directories other owners needs root, as the agent has (CI runs as root)
    require_service(os.geteuid() == 0, "root (to chown the fake /proc entries)")
    root = proc(tmp_path, {"100": {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0"},
                           "101": {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0"},
                           "200": {"SLURM_JOB_ID": "43", "SLURM_JOB_GPUS": "1"},
                           "300": {"SLURM_JOB_ID": "44", "SLURM_JOB_GPUS": "2"}})
    os.chown(root / "100", 0, 0)
    os.chown(root / "101", 65534, 65534)
    os.chown(root / "200", 3_999_999, 3_999_999)
    os.chown(root / "300", 0, 0)  # only root: root it is
    assert allocations(root) == {0: Allocation("42", user_name(65534)), 1: Allocation("43", "3999999"),
                                 2: Allocation("44", user_name(0))}
    assert user_name(65534) != "65534" and user_name(0) == "root"


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
    assert idle.observe(t0, {0: 0.0}, {0: Allocation("7")}) == []
    assert idle.observe(t0 + timedelta(minutes=5), {0: 0.0}, {}) == []  # job 7 ended
    assert idle.observe(t0 + timedelta(minutes=12), {0: 0.0}, {0: Allocation("8")}) == []  # its own clock
    assert [e.attr("job") for e in idle.observe(t0 + timedelta(minutes=22), {0: 0.0}, {0: Allocation("8")})] == ["8"]


def test_two_idle_spells_that_start_within_one_second_are_two_reports(tmp_path: Path) -> None:
    """At a slow cadence under a second one spell can end and the next start within the same second: the
    second report is a new event, not a reuse of the first one's id (decision 0129)."""
    idle, t0, job = IdleGpus("n1", timedelta(seconds=0.2), 5.0, tmp_path), FakeClock().now(), {0: Allocation("7")}

    def at(s: float, util: float) -> list[HealthEvent]:
        return idle.observe(t0 + timedelta(seconds=s), {0: util}, job)

    assert at(0.1, 0.0) == []
    [first] = at(0.3, 0.0)
    assert at(0.4, 90.0) == [] and at(0.5, 0.0) == []  # works, then idles again
    [again] = at(0.7, 0.0)
    assert again.id != first.id


def test_the_report_names_the_owner_and_the_memory_the_idle_gpu_held(tmp_path: Path) -> None:
    """The most memory in use over the idle window is reported: a GPU with nothing loaded (a CUDA context
    at most) apart from one that keeps the job's data while it computes nothing."""
    clock = FakeClock()
    idle = IdleGpus("n1", timedelta(minutes=10), 5.0, tmp_path)
    t0 = clock.now()
    jobs = {0: Allocation("7", "alice"), 1: Allocation("7", "alice"), 2: Allocation("9")}
    assert idle.observe(t0, {0: 0.0, 1: 2.0, 2: 0.0}, jobs, {0: 3.0, 1: 30_000.0}) == []
    assert idle.owners == {(0, "7"): "alice", (1, "7"): "alice", (2, "9"): ""}
    found = idle.observe(t0 + timedelta(minutes=10), {0: 0.0, 1: 0.0, 2: 0.0}, jobs, {0: 510.0, 1: 12_000.0})
    by_gpu = {e.attr("gpu"): e for e in found}
    assert {g: (e.attr("memory"), e.attr("mem_used_mib"), e.attr("user")) for g, e in by_gpu.items()} == {
        "0": ("empty", "510", "alice"), "1": ("held", "30000", "alice"), "2": ("unknown", "", "")}
    assert "holding up to 30000 MiB" in by_gpu["1"].message and "user alice" in by_gpu["1"].message
    assert "nothing loaded" in by_gpu["0"].message


def test_with_a_memory_limit_only_a_gpu_holding_at_most_that_much_counts_as_idle(tmp_path: Path) -> None:
    clock = FakeClock()
    idle = IdleGpus("n1", timedelta(minutes=10), 5.0, tmp_path, max_memory_mib=2048)
    t0 = clock.now()
    jobs = {0: Allocation("7", "alice"), 1: Allocation("7", "alice"), 2: Allocation("7", "alice")}
    util = {0: 0.0, 1: 0.0, 2: 0.0}
    # GPU 0 holds 40 GiB: not idle by this site's rule; GPU 2 does not report memory: not shown to be empty
    assert idle.observe(t0, util, jobs, {0: 40_960.0, 1: 2048.0, 2: None}) == []
    assert set(idle.idle_seconds(t0)) == {(1, "7")}
    found = idle.observe(t0 + timedelta(minutes=10), util, jobs, {0: 40_960.0, 1: 600.0})
    assert [(e.attr("gpu"), e.attr("memory"), e.attr("mem_used_mib")) for e in found] == [("1", "held", "2048")]
    # GPU 0 frees its memory: its clock starts only now; GPU 1 loads data: re-armed
    assert idle.observe(t0 + timedelta(minutes=11), util, jobs, {0: 500.0, 1: 9000.0}) == []
    assert set(idle.idle_seconds(t0 + timedelta(minutes=11))) == {(0, "7")}
    assert idle.observe(t0 + timedelta(minutes=20), util, jobs, {0: 500.0, 1: 9000.0}) == []
    assert [e.attr("gpu") for e in idle.observe(t0 + timedelta(minutes=21), util, jobs, {0: 500.0})] == ["0"]


@pytest.mark.parametrize(("after", "util", "mem", "field"), [
    (timedelta(0), 5.0, None, "idle_gpu_after_s"),
    (timedelta(minutes=1), 100.0, None, "idle_gpu_max_util_pct"),
    (timedelta(minutes=1), 5.0, -1.0, "idle_gpu_max_memory_mib"),
    (timedelta(minutes=1), 5.0, float("nan"), "idle_gpu_max_memory_mib"),
])
def test_bad_settings_are_named(after: timedelta, util: float, mem: float | None, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        IdleGpus("n1", after, util, max_memory_mib=mem)
    assert err.value.field == field


@pytest.mark.parametrize(("value", "expected"), [
    ("-512", "greater than or equal to 0"),
    ("true", "MiB of GPU memory"),  # a switch would silently mean 1 MiB: no GPU would ever be idle
    ('"2 GiB"', "valid number"),
    ("nan", "finite number"),
])
def test_a_bad_memory_limit_in_the_agent_config_is_refused_naming_key_and_value(
        tmp_path: Path, value: str, expected: str) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f"idle_gpu_max_memory_mib = {value}\n")
    with pytest.raises(InvalidInput) as err:
        load_config(cfg)
    assert err.value.field == "idle_gpu_max_memory_mib" and expected in err.value.expected
    assert str(err.value).startswith("idle_gpu_max_memory_mib: got ")  # the key and the value as read
    cfg.write_text("idle_gpu_max_memory_mib = 2048\n")
    assert load_config(cfg).idle_gpu_max_memory_mib == 2048
    cfg.write_text("")
    assert load_config(cfg).idle_gpu_max_memory_mib is None  # off by default


ALL = ["n1-gpu0", "n1-gpu1", "n1-gpu2"]


@pytest.mark.parametrize(("load", "max_memory_mib", "reported"), [
    (0.0, None, ALL),
    (60.0, None, []),
    (0.0, 256.0, []),  # the simulated idle GPU holds ~408 MiB (a CUDA context): more than this site allows
    (0.0, 1024.0, ALL),
])
def test_the_agents_slow_tick_reports_idle_allocated_gpus_and_exports_the_idle_time(
        tmp_path: Path, load: float, max_memory_mib: float | None, reported: list[str]) -> None:
    clock = FakeClock()
    dev = SimDevice(4, clock=clock, load=load, seed=3)
    seen: list[HealthEvent] = []
    agent = Agent("n1", dev, clock, cadence=Cadence(fast_s=1, slow_s=30),
                  idle=IdleGpus("n1", timedelta(minutes=2), 15.0, proc(tmp_path, JOBS), max_memory_mib),
                  on_events=seen.extend)
    agent.open()
    for _ in range(200):  # 200 s of ticks
        agent.tick()
        clock.advance(1.0)
    idle = [e for e in seen if e.kind == EventKind.GPU_IDLE]
    assert sorted(e.component for e in idle) == reported
    pci = {g.index: g.pci_bus_id for g in dev.gpus()}
    assert all(e.attr("pci") == pci[int(e.attr("gpu"))] and e.source == "nvml" for e in idle)
    me = user_name(os.geteuid())
    held = {round((dev.read_fast(i).mem_used_bytes or 0) / 2**20) for i in range(3)}  # the device's own MiB
    assert all(e.attr("user") == me and e.attr("memory") == "empty" and {int(e.attr("mem_used_mib"))} <= held
               for e in idle)
    samples = [smp for m in make_registry(agent.telemetry).collect() if m.name == "gpufleet_gpu_idle_seconds"
               for smp in m.samples]
    assert sorted((smp.labels["gpu"], smp.labels["job"], smp.labels["user"]) for smp in samples
                  if smp.value >= 120) == ([("0", "42", me), ("1", "43", me), ("2", "42", me)] if reported else [])
