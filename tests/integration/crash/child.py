"""The controller process the crash test kills: ``python -m tests.integration.crash.child DIR``, or
forked by ``tests.integration.forkserver`` (as the test starts it: the imports once, not per start).

Runs the production runtime (SQLite store, reconciler thread, HTTP API) with a file-backed simulated
scheduler, and writes the bound port to DIR/port once it serves.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from gpufleet.controller.runtime import build
from gpufleet.controller.settings import ControllerSettings, Role, SchedulerKind, TokenConfig
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.sim import SimScheduler

TOKEN = "crash-test-token-0123456789"
NODES = 100


def main(workdir: Path) -> None:
    fleet = simulated_fleet(NODES, 10)
    settings = ControllerSettings(database_url=f"sqlite:///{workdir / 'gpufleet.db'}", port=0,
                                  scheduler=SchedulerKind.SIM,
                                  tokens=(TokenConfig(name="crash", role=Role.ADMIN, token=TOKEN),))
    # A generous budget so that many actions run (the breaker has its own tests).
    policy = parse_policy({"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
                           "policy": {"heartbeat_timeout": "0s"}})
    scheduler = SimScheduler([n.id for n in fleet], state_file=workdir / "scheduler.json")
    rt = build(settings, scheduler, policy=policy)
    rt.controller.register_fleet(fleet, NodeState.READY)
    rt.start_reconciler(interval=0.05)
    rt.start_api(on_started=lambda port: (workdir / "port.tmp").write_text(str(port)))
    (workdir / "port.tmp").replace(workdir / "port")
    threading.Event().wait()


def cli(args: list[str]) -> None:
    """``DIR``: serve until killed (what the fork server runs in each process it forks)."""
    main(Path(args[0]))


if __name__ == "__main__":
    cli(sys.argv[1:])
