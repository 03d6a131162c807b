"""The agent against the real controller (``gpufleet.controller``: FastAPI + SQLite store + engine).

The controller is down during a burst of 10,000 events, then comes up on the same port and database:
every event ends up in the controller's store exactly once. The agent also starts before its node is
registered: nothing is dropped, the events go through once an admin registers the node.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from gpufleet.agent.clock import SystemClock
from gpufleet.agent.config import load_config
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import ControllerSettings, Role, SchedulerKind, TokenConfig
from gpufleet.controller.store.repo import Page
from gpufleet.domain.fleet import Fleet, Gpu, Node
from gpufleet.schedulers.sim import SimScheduler
from tests.integration.agent.harness import running_agent, wait_for
from tests.integration.agent.test_spool_outage import burst
from tests.unit.agent.controller_double import free_port

NODE = "r01-n003"
AGENT_TOKEN = "agent-token-r01-n003-0123456789"


def start_controller(db: Path, port: int, *, register: bool) -> Runtime:
    settings = ControllerSettings(
        database_url=f"sqlite:///{db}",
        host="127.0.0.1",
        port=port,
        reconcile_interval=1.0,
        scheduler=SchedulerKind.SIM,
        tokens=(TokenConfig(name=f"agent-{NODE}", role=Role.AGENT, token=AGENT_TOKEN, nodes=(NODE,)),),
    )
    rt = build(settings, SimScheduler([NODE]))
    if register:
        gpus = tuple(Gpu(f"{NODE}-gpu{i}", i, f"GPU-{i:04d}") for i in range(8))
        rt.controller.register_fleet(Fleet.of([Node(id=NODE, rack="r01", gpus=gpus)]))
    rt.start_api(on_started=lambda _port: None)
    return rt


def stored_xids(rt: Runtime) -> Counter[tuple[str, int]]:
    rows = rt.controller.store.events(node=NODE, kind="xid", page=Page(limit=20_000))
    return Counter((r.component or "", r.code or 0) for r in rows)


def agent_config(tmp_path: Path, port: int) -> object:
    token = tmp_path / "token"
    token.write_text(AGENT_TOKEN + "\n")
    return load_config(
        None,
        node=NODE,
        device="sim",
        gpus=8,
        controller=f"http://127.0.0.1:{port}",
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


def test_real_controller_down_during_10000_events_then_up(tmp_path: Path) -> None:
    port, db = free_port(), tmp_path / "controller.db"
    rt = start_controller(db, port, register=True)
    rt.shutdown()  # registered, then down
    clock = SystemClock()
    sim = SimDevice(8, clock=clock, seed=11)
    with running_agent(agent_config(tmp_path, port), sim, clock) as agent:  # type: ignore[arg-type]
        want = burst(sim, 10_000)
        wait_for(lambda: agent.metrics().get("gpufleet_agent_spool_events", 0) >= 10_000, "10,000 spooled")
        wait_for(lambda: agent.metrics().get("gpufleet_agent_push_failures_total", 0) >= 3, "failed pushes")
        rt = start_controller(db, port, register=False)
        try:
            wait_for(lambda: agent.metrics().get("gpufleet_agent_spool_events") == 0, "spool drained", 180)
            assert stored_xids(rt) == want
            assert sum(want.values()) == 10_000
            m = agent.metrics()
            assert m["gpufleet_agent_push_events_total"] == 10_000 and m["gpufleet_agent_spool_dropped_total"] == 0
            # The heartbeat retries on its own schedule: wait for it rather than race it.
            wait_for(lambda: getattr(rt.controller.store.node(NODE), "last_heartbeat", None) is not None,
                     "heartbeat recorded")
        finally:
            rt.shutdown()


def test_unregistered_node_loses_nothing(tmp_path: Path) -> None:
    port, db = free_port(), tmp_path / "controller.db"
    rt = start_controller(db, port, register=False)
    try:
        clock = SystemClock()
        sim = SimDevice(8, clock=clock, seed=12)
        with running_agent(agent_config(tmp_path, port), sim, clock) as agent:  # type: ignore[arg-type]
            want = burst(sim, 300)
            # refused (the inventory of an unknown node first): the events wait in the spool, all of them
            wait_for(lambda: agent.metrics().get("gpufleet_agent_push_failures_total", 0) >= 2
                     and agent.metrics().get("gpufleet_agent_spool_events") == 300, "refusals, events kept")
            gpus = tuple(Gpu(f"{NODE}-gpu{i}", i, f"GPU-{i:04d}") for i in range(8))
            rt.controller.register_fleet(Fleet.of([Node(id=NODE, rack="r01", gpus=gpus)]))
            wait_for(lambda: agent.metrics().get("gpufleet_agent_spool_events") == 0, "spool drained")
        assert stored_xids(rt) == want
    finally:
        rt.shutdown()
