"""A real gpufleet controller (store + reconciler + HTTP API, in this process) acting on the lab's Slurm.

Used by the end-to-end tests and the detect-to-drain benchmark. The policy is tuned for tests: short
checkpoint polling and retry back-off, no blast-radius limit (the lab has only three nodes).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from gpufleet.controller.reconciler import Validator
from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import (
    ControllerSettings,
    RepairSettings,
    SchedulerKind,
    SparesSettings,
    TokenConfig,
)
from gpufleet.schedulers.port import Scheduler
from gpufleet.schedulers.slurm import SlurmScheduler
from tests.e2e.harness import ADMIN_TOKEN, AGENT_TOKEN, BASE_POLICY

__all__ = ["ADMIN_TOKEN", "AGENT_TOKEN", "POLICY", "LabController"]

# The end-to-end harness's policy (tests/e2e/harness.py), with a shorter checkpoint wait.
POLICY = BASE_POLICY.replace("auto_repair = false\n", 'checkpoint_wait_timeout = "10m"\nauto_repair = false\n')


@dataclass
class LabController:
    runtime: Runtime
    url: str
    admin: httpx.Client
    agent: httpx.Client

    @classmethod
    def start(cls, workdir: Path, scheduler: Scheduler, nodes: list[str], *, interval: float = 0.1,
              policy_text: str = POLICY, validator: Validator | None = None,
              new_nodes: Sequence[str] = (), repair: RepairSettings | None = None,
              spares: SparesSettings | None = None, leaves: Mapping[str, str] | None = None) -> LabController:
        """``nodes`` are registered ready (in rack r1, behind ``leaves[node]`` when given), ``new_nodes`` new
        (they go through burn-in). A controller restarted on the same workdir passes no nodes."""
        policy = workdir / "policy.toml"
        policy.write_text(policy_text)
        settings = ControllerSettings(
            database_url=f"sqlite:///{workdir / 'controller.db'}", policy_file=policy, port=0,
            scheduler=SchedulerKind.SLURM if isinstance(scheduler, SlurmScheduler) else SchedulerKind.SIM,
            reconcile_interval=interval, repair=repair or RepairSettings(), spares=spares or SparesSettings(),
            tokens=(TokenConfig(name="admin", role="admin", token=ADMIN_TOKEN),
                    TokenConfig(name="agent", role="agent", token=AGENT_TOKEN, nodes=("*",))),
        )
        rt = build(settings, scheduler, validator=validator)
        ports: list[int] = []
        rt.start_api(on_started=ports.append)
        url = f"http://127.0.0.1:{ports[0]}/v1"
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
        agent = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {AGENT_TOKEN}"}, timeout=30)
        if nodes:
            r = admin.post("/nodes", json={"nodes": [{"id": n, "rack": "r1", "leaves": [leaves[n]] if leaves else []}
                                                     for n in nodes], "state": "ready"})
            r.raise_for_status()
        if new_nodes:
            r = admin.post("/nodes", json={"nodes": [{"id": n, "rack": "r1"} for n in new_nodes], "state": "new"})
            r.raise_for_status()
        rt.start_reconciler(interval)
        return cls(rt, url, admin, agent)

    def stop(self) -> None:
        self.runtime.shutdown()
        self.admin.close()
        self.agent.close()

    def post_event(self, node: str, kind: str, **fields: Any) -> str:
        eid = f"ev-{uuid.uuid4().hex[:12]}"
        body = {"id": eid, "node": node, "kind": kind, "time": datetime.now(UTC).isoformat(), **fields}
        r = self.agent.post("/events", json={"events": [body]})
        r.raise_for_status()
        return eid

    def node_state(self, node: str) -> str:
        return str(self.admin.get(f"/nodes/{node}").json()["node"]["state"])

    def actions(self, node: str) -> list[dict[str, Any]]:
        r = self.admin.get("/actions", params={"node": node})
        r.raise_for_status()
        out: list[dict[str, Any]] = r.json()
        return out

    def action(self, node: str, kind: str) -> dict[str, Any] | None:
        return next((a for a in self.actions(node) if a["kind"] == kind), None)

    def audit(self, node: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.admin.get("/audit", params={"target": node}).json()
        return out

    def decisions(self, node: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.admin.get("/decisions", params={"node": node}).json()
        return out
