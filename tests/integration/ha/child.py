"""One controller replica for the HA tests:
``python -m tests.integration.ha.child DIR NAME URL LEASE RENEW [SETTINGS.toml]``.

The production runtime (``runtime.build``: election, fence, reconciler thread, HTTP API) on the test's
PostgreSQL, with a simulated scheduler whose state every replica shares through DIR/scheduler.json (each
call reads it under a file lock, so the scheduler is one, as a real one is). Writes the bound port to
DIR/NAME.port once it serves. The fleet is registered by whichever replica leads first. SETTINGS.toml, when
given, adds its ``[tls]``, ``[ha]`` and ``[limits]`` keys, its ``[[tokens]]`` and its ``[[tenant]]`` pools to the
replica's settings.
"""

from __future__ import annotations

import fcntl
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpufleet.controller.runtime import build
from gpufleet.controller.settings import (
    ControllerSettings,
    HaSettings,
    LimitSettings,
    Role,
    SchedulerKind,
    TenantConfig,
    TlsSettings,
    TokenConfig,
)
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState
from gpufleet.schedulers.sim import SimScheduler

TOKEN = "ha-test-token-0123456789"
NODES = 300
RACKS = 10


class SharedSim:
    """A SimScheduler whose state lives in a file shared by every replica (read afresh on every call)."""

    name = "sim"

    def __init__(self, nodes: list[str], state: Path) -> None:
        self._state, self._lock = state, state.with_suffix(".lock")
        with self._locked():
            self._sim = SimScheduler(nodes, state_file=state)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._sim, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._locked():
                self._sim._load(self._state)
                return attr(*args, **kwargs)
        return call


def main(workdir: Path, name: str, url: str, lease_s: float, renew_s: float, extra: Path | None = None) -> None:
    fleet = simulated_fleet(NODES, RACKS)
    more: dict[str, Any] = tomllib.loads(extra.read_text(encoding="utf-8")) if extra is not None else {}
    settings = ControllerSettings(database_url=url, port=0, scheduler=SchedulerKind.SIM,
                                  ha=HaSettings(lease_s=lease_s, renew_s=renew_s, **more.get("ha", {})),
                                  tls=TlsSettings(**more.get("tls", {})),
                                  limits=LimitSettings(**more.get("limits", {})),
                                  tenant=tuple(TenantConfig(**t) for t in more.get("tenant", ())),
                                  tokens=(TokenConfig(name="ha", role=Role.ADMIN, token=TOKEN),
                                          *(TokenConfig(**t) for t in more.get("tokens", ()))))
    policy = parse_policy({"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
                           "policy": {"heartbeat_timeout": "0s"}})
    scheduler: Any = SharedSim([n.id for n in fleet], workdir / "scheduler.json")
    rt = build(settings, scheduler, policy=policy)
    rt.when_leading(lambda: rt.controller.register_fleet(fleet, NodeState.READY))
    rt.start_reconciler(interval=0.05)
    port = workdir / f"{name}.port"
    rt.start_api(on_started=lambda p: port.with_suffix(".tmp").write_text(str(p)))
    port.with_suffix(".tmp").replace(port)
    threading.Event().wait()


def cli(args: list[str]) -> None:
    """``DIR NAME DB_URL LEASE_S RENEW_S [SETTINGS.toml]``: serve until killed (what the fork server runs in
    each process it forks)."""
    main(Path(args[0]), args[1], args[2], float(args[3]), float(args[4]), Path(args[5]) if len(args) > 5 else None)


if __name__ == "__main__":
    cli(sys.argv[1:])
