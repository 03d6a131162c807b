"""Run the demo: a real controller (SQLite, policy, breaker, correlator, reconciler, HTTP API) on a
simulated HGX fleet whose topology (nodes, racks, NICs, leaf switches) comes from ``generate_hgx``."""

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
from gpufleet.controller.settings import ControllerSettings, Role, SchedulerKind, TokenConfig
from gpufleet.demo.report import START
from gpufleet.demo.world import DemoScheduler, Validator, build_world
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.topology import dump_topology, to_fleet
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState


@dataclass(frozen=True, slots=True)
class DemoOptions:
    seed: int = 7
    duration: timedelta = timedelta(hours=12)
    nodes: int = 32  # HGX nodes, 4 to a rack, 32 to a scalable unit (one leaf per rail)
    step: timedelta = timedelta(minutes=1)
    wall_seconds: float = 60.0  # pace the live view to about this long; 0 = as fast as possible
    port: int = 0  # 0 = any free port
    headless: bool = False
    database: Path | None = None
    serve_api: bool = True

    def validate(self) -> None:
        if self.nodes < 4:
            raise InvalidInput("--nodes", self.nodes, "at least 4 nodes")
        if self.nodes > 1024:
            raise InvalidInput("--nodes", self.nodes, "at most 1024 nodes (the demo steps every node each minute)")
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
    # The controller reads the topology as `gpufleet controller serve` does (topology_file), so the
    # correlator runs on the same file a site would give it.
    topology = generate_hgx(opts.nodes, seed=opts.seed)
    topology_file = Path(tmp.name) / "topology.json"
    topology_file.write_text(dump_topology(topology), encoding="utf-8")
    settings = ControllerSettings(database_url=f"sqlite:///{db}", host="127.0.0.1", port=opts.port,
                                  scheduler=SchedulerKind.SIM, topology_file=topology_file,
                                  tokens=(TokenConfig(name="demo", role=Role.ADMIN, token=token),))
    fleet = to_fleet(topology)
    clock = ManualClock(START)
    scheduler = DemoScheduler([n.id for n in fleet], clock)
    policy = parse_policy({"policy": {"heartbeat_timeout": "15m"}})  # the demo's agents report every 5 min
    rt = build(settings, scheduler, clock=clock, policy=policy)
    # The job's nodes are in service already; the spares (the last nodes by name, which the job does
    # not take) were just delivered: they go through burn-in before they take work (time to market).
    spares = max(2, opts.nodes // 8)
    delivered = sorted(n.id for n in fleet)[opts.nodes - spares:]
    rt.controller.register([n for n in fleet if n.id not in delivered], state=NodeState.READY)
    rt.controller.register([n for n in fleet if n.id in delivered], state=NodeState.NEW)
    world = build_world(rt.controller, topology, fleet, clock, scheduler, opts.duration, opts.seed,
                        opts.nodes - spares)
    world.broken[delivered[0]] = "dead on arrival: HBM errors in burn-in"  # burn-in finds one bad node
    world.log.append(f"+00:00 {len(delivered)} newly delivered spare nodes start burn-in before they take work "
                     f"({', '.join(delivered)})")
    world.reconciler = Reconciler(rt.controller, scheduler, Validator(world))
    rt.reconciler = world.reconciler

    api = "(not served)"
    if opts.serve_api:
        rt.start_api(on_started=lambda port: None)
        api = f"http://127.0.0.1:{rt.bound_port()}/v1"
        base = f"http://127.0.0.1:{rt.bound_port()}"
        console.print(f"[bold]controller API[/bold] {api}  (token: {token}), served until the demo ends;\n"
                      f"  meanwhile, in another shell: GPUFLEET_TOKEN={token} gpufleet fleet --url {base} status",
                      highlight=False)
    steps = int(opts.duration / opts.step)
    pace = opts.wall_seconds / steps if steps and not opts.headless else 0.0
    try:
        if opts.headless:
            for _ in range(steps):
                world.step(opts.step)
        else:
            from gpufleet.demo.view import render

            try:
                with Live(render(world, api), console=console, refresh_per_second=8, transient=False) as live:
                    for _ in range(steps):
                        t0 = time.monotonic()
                        world.step(opts.step)
                        live.update(render(world, api))
                        left = pace - (time.monotonic() - t0)
                        if left > 0:
                            time.sleep(left)
            finally:  # also on Ctrl-C or an error: what follows must not be glued to the last frame
                if not console.is_terminal:  # Rich ends the last frame with a line break only on a terminal
                    console.line()
        summary = world.summary()
        summary["api"] = api
        return summary
    finally:
        rt.shutdown()
        tmp.cleanup()


def print_summary(summary: dict[str, object], console: Console) -> None:
    from rich.table import Table

    t = Table(title="demo summary", show_header=False)
    for key in ("nodes", "racks", "job_nodes", "interruptions", "drained", "repaired", "returned_to_service",
                "revalidated", "breaker_trips", "decisions", "detect_to_drain_s", "ettr", "mttf_hours",
                "badput_hours", "final_states"):
        value = summary[key]
        if key == "ettr":
            value = f"{float(str(value)):.2%}"
        t.add_row(key, json.dumps(value) if isinstance(value, dict | list) else str(value))
    ttm = summary["ttm"]
    assert isinstance(ttm, dict)
    until = ", ".join(f"{u['share']:g} % after {u['after_s'] / 60:.0f} min" for u in ttm["until"]
                      if u["after_s"] is not None)
    t.add_row("ttm", f"{ttm['burned_in']} delivered nodes burned in, {ttm['failures_found']} failure(s) found; "
              f"{until or 'not all ready'}")
    correlated = summary["correlated"]
    assert isinstance(correlated, list)
    t.add_row("correlated", "\n".join(str(c["summary"]) for c in correlated) or "none")
    console.print(t)
    timeline = summary["timeline"]
    assert isinstance(timeline, list)
    console.print("[bold]what happened[/bold]\n" + "\n".join(str(line) for line in timeline), highlight=False)
