"""Run the demo: a real controller (SQLite, policy, breaker, reconciler, HTTP API) on a simulated fleet."""

from __future__ import annotations

import json
import logging
import secrets
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.live import Live

from gpufleet.controller.clock import ManualClock
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.runtime import build
from gpufleet.controller.settings import ControllerSettings, Role, TokenConfig
from gpufleet.demo.world import START, DemoScheduler, Validator, build_world
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState


@dataclass(frozen=True, slots=True)
class DemoOptions:
    seed: int = 7
    duration: timedelta = timedelta(hours=12)
    nodes: int = 32
    racks: int = 4
    step: timedelta = timedelta(minutes=1)
    wall_seconds: float = 60.0  # pace the live view to about this long; 0 = as fast as possible
    port: int = 0  # 0 = any free port
    headless: bool = False
    database: Path | None = None
    serve_api: bool = True

    def validate(self) -> None:
        if self.nodes < 4:
            raise InvalidInput("--nodes", self.nodes, "at least 4 nodes")
        if not 1 <= self.racks <= self.nodes:
            raise InvalidInput("--racks", self.racks, f"between 1 and --nodes ({self.nodes})")
        if self.duration < timedelta(hours=1):
            raise InvalidInput("--duration", self.duration, "at least 1h of simulated time")
        if self.wall_seconds < 0:
            raise InvalidInput("--wall-seconds", self.wall_seconds, "a non-negative number of seconds")


def run_demo(opts: DemoOptions, console: Console | None = None) -> dict[str, object]:
    opts.validate()
    console = console or Console(stderr=True)
    logging.getLogger("gpufleet").setLevel(logging.ERROR)  # the live view shows what matters
    tmp = tempfile.TemporaryDirectory(prefix="gpufleet-demo-")
    db = opts.database or Path(tmp.name) / "gpufleet.db"
    token = secrets.token_urlsafe(24)
    settings = ControllerSettings(database_url=f"sqlite:///{db}", host="127.0.0.1", port=opts.port,
                                  tokens=(TokenConfig(name="demo", role=Role.ADMIN, token=token),))
    fleet = simulated_fleet(opts.nodes, opts.racks)
    clock = ManualClock(START)
    scheduler = DemoScheduler([n.id for n in fleet], clock)
    policy = parse_policy({"policy": {"heartbeat_timeout": "15m"}})  # the demo's agents report every 5 min
    rt = build(settings, scheduler, clock=clock, policy=policy)
    rt.controller.register_fleet(fleet, NodeState.READY)
    spares = max(2, opts.nodes // 8)
    world = build_world(rt.controller, fleet, clock, scheduler, opts.duration, opts.seed, opts.nodes - spares)
    world.reconciler = Reconciler(rt.controller, scheduler, Validator(world))
    rt.reconciler = world.reconciler

    api = "(not served)"
    if opts.serve_api:
        rt.start_api(on_started=lambda port: None)
        api = f"http://127.0.0.1:{rt.bound_port()}/v1"
        console.print(f"[bold]controller API[/bold] {api}  (token: {token})\n"
                      f"  try: curl -H 'Authorization: Bearer {token}' {api}/status", highlight=False)
    steps = int(opts.duration / opts.step)
    pace = opts.wall_seconds / steps if steps and not opts.headless else 0.0
    try:
        if opts.headless:
            for _ in range(steps):
                world.step(opts.step)
        else:
            from gpufleet.demo.view import render

            with Live(render(world, api), console=console, refresh_per_second=8, transient=False) as live:
                for _ in range(steps):
                    t0 = time.monotonic()
                    world.step(opts.step)
                    live.update(render(world, api))
                    left = pace - (time.monotonic() - t0)
                    if left > 0:
                        time.sleep(left)
        summary = world.summary()
        summary["api"] = api
        return summary
    finally:
        rt.shutdown()
        tmp.cleanup()


def print_summary(summary: dict[str, object], console: Console) -> None:
    from rich.table import Table

    t = Table(title="demo summary", show_header=False)
    for key in ("nodes", "job_nodes", "interruptions", "drained", "repaired", "returned_to_service",
                "breaker_trips", "decisions", "detect_to_drain_s", "ettr", "mttf_hours", "badput_hours",
                "final_states"):
        value = summary[key]
        if key == "ettr":
            value = f"{float(str(value)):.2%}"
        t.add_row(key, json.dumps(value) if isinstance(value, dict | list) else str(value))
    console.print(t)
