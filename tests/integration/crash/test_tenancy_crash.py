"""Crash safety of a tenancy move (docs/tenancy.md): SIGKILL a real ``gpufleet controller serve`` while
the node's wipe is queued for its agent, and again while the node is being validated; each restarted
controller resumes the same move — the agent sees one wipe, never two — and the node is handed to its
new tenant only after its validation passed, with every step audited once."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.e2e.harness import AGENT_TOKEN, Fleet, wait_until

pytestmark = [pytest.mark.tenancy, pytest.mark.slow]

CONFIG = """
[tenancy]
wipe = "script:reimage"
validation = "quick"

[[tenant]]
name = "acme"
nodes = ["n1"]
pkey = "0x0a01"

[[tenant]]
name = "globex"
nodes = ["n2"]
pkey = "0x0a02"
"""


def test_sigkill_mid_reprovision_resumes_and_runs_nothing_twice(fleet: Fleet) -> None:
    ctl = fleet.controller(nodes=["n1", "n2"], extra_config=CONFIG)
    api, node = ctl.api, "n1"
    moved = api.post(f"/nodes/{node}/tenant", {"to": "globex", "reason": "crash test"})
    assert moved["state"] == "running" and moved["from_tenant"] == "acme"

    def queued() -> list[dict[str, Any]]:
        r = httpx.get(f"{api.url}/nodes/{node}/commands", headers={"Authorization": f"Bearer {AGENT_TOKEN}"})
        r.raise_for_status()
        cmds: list[dict[str, Any]] = r.json()["commands"]
        return cmds

    def owners() -> dict[str, list[str]]:
        return {t["name"]: t["nodes"] for t in api.get("/tenancy")["tenants"]}

    wipe = wait_until(queued, "the wipe queued for the node's agent", 30)
    assert [c["kind"] for c in wipe] == ["script:reimage"]
    assert owners() == {"acme": [], "globex": ["n2"]}, "released: no tenant while it is reprovisioned"
    fleet.kill_controller()  # the wipe is queued; the controller waits for its result
    fleet.restart_controller()
    assert [c["id"] for c in wait_until(queued, "the same wipe after the restart", 30)] == [wipe[0]["id"]]
    r = httpx.post(f"{api.url}/nodes/{node}/commands/{wipe[0]['id']}/result",
                   json={"ok": True, "detail": "reimaged"}, headers={"Authorization": f"Bearer {AGENT_TOKEN}"})
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    wait_until(lambda: api.node_state(node) == "revalidate", "wiped -> validation", 30)
    fleet.kill_controller()  # mid-validation
    fleet.restart_controller()
    assert owners()["acme"] == [] and owners()["globex"] == ["n2"], "not handed over before validation"
    assert queued() == [], "the wipe is not queued again"
    check = {"id": "v-n1", "node": node, "kind": "check_passed", "time": datetime.now(UTC).isoformat(),
             "source": "check", "attrs": {"check": "gemm_bf16"}}
    api.post("/events", {"events": [check]})
    wait_until(lambda: api.get("/tenancy")["moves"][0]["state"] == "done", "handed over", 30)
    assert owners() == {"acme": [], "globex": ["n1", "n2"]}
    actions = [a["action"] for a in api.get("/audit", target=node, limit=1000)][::-1]
    steps = [a for a in actions if a.startswith(("tenancy_", "maintenance_"))]
    assert steps == ["tenancy_move", "maintenance_draining", "maintenance_action", "maintenance_validating",
                     "maintenance_done", "tenancy_handover"], actions
    assert [e for e in fleet.sim_scheduler_effects() if e[0] == "drain" and e[1] == node].__len__() == 1
