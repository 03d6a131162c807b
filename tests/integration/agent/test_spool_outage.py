"""At-least-once delivery: the controller is down during a burst of 10,000 events, then comes back.

The agent runs for real (run_agent: runner thread, SQLite spool, push thread with backoff) against a
real HTTP server on 127.0.0.1 that implements the controller's agent API and deduplicates by id.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gpufleet.agent.clock import SystemClock
from gpufleet.agent.config import AgentConfig, load_config
from gpufleet.agent.devices.sim import SimDevice
from tests.integration.agent.harness import running_agent, wait_for
from tests.unit.agent.controller_double import ControllerDouble

CODES = (13, 31, 43, 48, 63, 74, 79, 94, 95, 119)


def config(tmp_path: Path, ctl: ControllerDouble) -> AgentConfig:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    return load_config(
        None,
        node="r01-n003",
        device="sim",
        gpus=8,
        controller=ctl.url,
        token_file=token,
        state_dir=tmp_path / "state",
        metrics_port=0,
        metrics_addr="127.0.0.1",
        kmsg=False,
        ib_root=tmp_path / "no-ib",
        push_backoff_base_s=0.05,
        push_backoff_cap_s=0.5,
        heartbeat_s=1.0,
    )


def burst(sim: SimDevice, n: int) -> Counter[tuple[str, int]]:
    want: Counter[tuple[str, int]] = Counter()
    for i in range(n):
        gpu, code = i % 8, CODES[i % len(CODES)]
        sim.inject_xid(gpu, code)
        want[(f"r01-n003-gpu{gpu}", code)] += 1
    return want


def stored(ctl: ControllerDouble) -> Counter[tuple[str, int]]:
    with ctl.lock:
        return Counter((e.component or "", e.code or 0) for e in ctl.events.values() if e.kind.value == "xid")


def test_controller_down_during_10000_events_then_up(tmp_path: Path) -> None:
    ctl = ControllerDouble()  # not started yet: the controller is down
    clock = SystemClock()
    sim = SimDevice(8, clock=clock, seed=1)
    with running_agent(config(tmp_path, ctl), sim, clock) as agent:
        want = burst(sim, 10_000)
        wait_for(lambda: agent.metrics().get("gpufleet_agent_spool_events", 0) >= 10_000, "10,000 spooled")
        wait_for(lambda: agent.metrics().get("gpufleet_agent_push_failures_total", 0) >= 3, "failed pushes")
        m = agent.metrics()
        assert m["gpufleet_agent_controller_up"] == 0 and m["gpufleet_agent_events_total{kind=xid}"] == 10_000
        ctl.start()
        try:
            wait_for(lambda: agent.metrics().get("gpufleet_agent_spool_events") == 0, "spool drained")
            assert stored(ctl) == want  # every event, exactly once
            assert len(ctl.events) == 10_000
            m = agent.metrics()
            assert m["gpufleet_agent_controller_up"] == 1 and m["gpufleet_agent_push_events_total"] == 10_000
            assert m["gpufleet_agent_spool_dropped_total"] == 0
            # The heartbeat has its own retry schedule: it resumes once the controller answers.
            wait_for(lambda: bool(ctl.heartbeats) and ctl.heartbeats[-1][0] == "r01-n003", "heartbeat resumed")
        finally:
            ctl.stop()


def test_spool_survives_an_agent_restart(tmp_path: Path) -> None:
    ctl = ControllerDouble()
    clock = SystemClock()
    cfg = config(tmp_path, ctl)
    sim = SimDevice(8, clock=clock, seed=2)
    with running_agent(cfg, sim, clock) as agent:
        want = burst(sim, 2_000)
        wait_for(lambda: agent.metrics().get("gpufleet_agent_spool_events", 0) >= 2_000, "2,000 spooled")
    # the agent is gone; the controller comes back; a new agent process starts on the same state dir
    ctl.start()
    try:
        with running_agent(cfg, SimDevice(8, clock=clock, seed=2), clock) as agent:
            wait_for(lambda: agent.metrics().get("gpufleet_agent_spool_events") == 0, "spool drained")
        assert stored(ctl) == want and len(ctl.events) == 2_000
    finally:
        ctl.stop()
