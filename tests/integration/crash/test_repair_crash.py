"""Crash safety of the repair ladder: SIGKILL a real ``gpufleet controller serve`` while the diagnostic
bundle capture, then a repair step (a GPU reset queued for the node's agent), is in flight; the
restarted controller resumes the same command each time — the agent sees one command, never two — and
the loop goes on to revalidation.

(The other phases of the loop, on the real Slurm lab: tests/e2e/test_loop_crash.py.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx

from tests.e2e.harness import AGENT_TOKEN, BASE_POLICY, Fleet, wait_until

POLICY = BASE_POLICY.replace("auto_repair = false\n", 'auto_repair = true\nheartbeat_timeout = "0s"\n')


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_sigkill_while_a_repair_step_is_in_flight_runs_it_once(fleet: Fleet) -> None:
    ctl = fleet.controller(nodes=["n1", "n2"], policy=POLICY, extra_config="[repair]\nagent = true")
    api, node = ctl.api, "n1"
    ev = {"id": "x48", "node": node, "kind": "xid", "code": 48, "time": datetime.now(UTC).isoformat(),
          "component": f"{node}-gpu0"}
    api.post("/events", {"events": [ev]})

    def queued() -> list[dict[str, Any]]:
        r = httpx.get(f"{api.url}/nodes/{node}/commands", headers=_h(AGENT_TOKEN))
        r.raise_for_status()
        cmds: list[dict[str, Any]] = r.json()["commands"]
        return cmds

    bundle = wait_until(queued, "a diagnostic bundle requested from the agent", 30)
    assert [c["kind"] for c in bundle] == ["diagnostic_bundle"]
    fleet.kill_controller()  # while waiting for the bundle
    fleet.restart_controller()
    wait_until(lambda: any(a["kind"] == "repair" and a["status"] == "waiting" for a in api.actions(node)),
               "the restarted controller resumed waiting for the bundle", 30)
    assert [c["id"] for c in queued()] == [bundle[0]["id"]], "the same capture, not a second one"
    r = httpx.post(f"{api.url}/nodes/{node}/commands/{bundle[0]['id']}/result",
                   json={"ok": False, "detail": "capture failed"}, headers=_h(AGENT_TOKEN))
    assert r.status_code == 200  # a failed capture: the repair goes on without it

    first = wait_until(lambda: [c for c in queued() if c["kind"] == "gpu_reset"], "a gpu_reset queued", 30)
    assert [c["kind"] for c in queued()] == ["gpu_reset"]
    fleet.kill_controller()  # mid-step: the command is queued, the controller is waiting for its result
    fleet.restart_controller()
    wait_until(lambda: any(a["kind"] == "repair" and a["status"] == "waiting" for a in api.actions(node)),
               "the restarted controller resumed the repair", 30)
    assert [c["id"] for c in queued()] == [first[0]["id"]], "the same step, not a second one"
    r = httpx.post(f"{api.url}/nodes/{node}/commands/{first[0]['id']}/result",
                   json={"ok": True, "detail": "simulated reset"}, headers=_h(AGENT_TOKEN))
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    wait_until(lambda: api.node_state(node) == "revalidate", "repair -> revalidate after the step worked", 30)
    steps = [a for a in api.get("/audit", target=node) if a["action"] == "repair_step"]
    assert len(steps) == 1, steps
