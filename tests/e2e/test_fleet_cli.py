"""``gpufleet fleet ...`` against a live controller process: every command, tables and ``--json``, and the
exit codes of its errors. What the CLI did is checked through the API, not through the CLI's own output."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain.durations import parse_duration
from tests.e2e.harness import (
    ADMIN_TOKEN,
    AGENT_TOKEN,
    BASE_POLICY,
    Controller,
    Fleet,
    TopologyFile,
    child_env,
    free_port,
    gpufleet_argv,
)

pytestmark = pytest.mark.e2e
NODES = {"n1": "r01", "n2": "r01", "n3": "r02", "n4": "r02"}
# One node of four may be out: the second fatal fault trips the breaker and is held.
TIGHT = BASE_POLICY.replace("max_unavailable_fleet = 1.0", "max_unavailable_fleet = 0.25")


def cli(ctl: Controller, *args: str, token: str | None = ADMIN_TOKEN, url: str | None = None,
        expect: int = 0) -> str:
    env = child_env({"GPUFLEET_TOKEN": token} if token is not None else {})
    out = subprocess.run(gpufleet_argv("fleet", "--url", url or ctl.url, *args), env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == expect, f"gpufleet fleet {' '.join(args)}: {out.returncode}\n{out.stderr}{out.stdout}"
    return out.stdout if expect == 0 else out.stderr


def cli_json(ctl: Controller, *args: str) -> Any:
    return json.loads(cli(ctl, *args, "--json"))


def fatal(ctl: Controller, node: str) -> None:
    now = datetime.now(UTC).isoformat()
    ctl.api.post("/events", {"events": [{"id": f"x79-{node}", "node": node, "kind": "xid", "code": 79, "time": now,
                                         "component": f"{node}-gpu0"}]})


@pytest.fixture
def ctl(fleet: Fleet) -> Controller:
    return fleet.controller(nodes=NODES, policy=TIGHT)


def test_status_nodes_node_and_events(ctl: Controller) -> None:
    fatal(ctl, "n1")
    status = cli_json(ctl, "status")
    assert status == ctl.api.get("/status") | {"events": status["events"]}
    table = cli(ctl, "status")
    assert "breaker" in table and "held decisions" in table
    nodes = cli_json(ctl, "nodes")
    assert sorted(n["id"] for n in nodes) == sorted(NODES)
    listed = cli(ctl, "nodes", "--rack", "r02")
    assert "n3" in listed and "n4" in listed and "n1" not in listed
    detail = cli_json(ctl, "node", "n1")
    assert detail["node"]["state"] in ("draining", "drained")
    assert [d["rule"] for d in detail["decisions"]] == [d["rule"] for d in ctl.api.decisions("n1")]
    assert "fatal_event" in cli(ctl, "node", "n1")
    events = cli_json(ctl, "events", "--node", "n1")
    assert [e["id"] for e in events] == [e["id"] for e in ctl.api.events("n1")]
    assert "x79-n1" not in cli(ctl, "events", "--node", "n2")


def test_held_decisions_approve_cancel_and_the_breaker(ctl: Controller) -> None:
    for node in ("n1", "n2", "n3"):
        fatal(ctl, node)
    breaker = cli_json(ctl, "breaker")
    assert breaker["tripped"] and breaker["held"] == 2 == ctl.api.breaker()["held"]
    assert "TRIPPED" in cli(ctl, "breaker")
    held = {d["node"] for d in ctl.api.get("/decisions", status="held")}
    assert held == {"n2", "n3"}
    approved = cli_json(ctl, "approve", "n2")
    assert approved["approved"] == ["n2"]
    assert ctl.api.node_state("n2") in ("draining", "drained")
    cancelled = cli_json(ctl, "cancel", "n3", "--reason", "false alarm")
    assert cancelled["cancelled"]
    breaker = ctl.api.breaker()
    assert breaker["held"] == 0
    # n1 and the approved n2 out of four, one allowed: nothing held, yet over the budget, and it says so
    assert breaker["tripped"] and breaker["reason"].startswith("no decision held, but fleet budget: 2 of 4 nodes")
    assert any(a["action"] == "approve_held" and a["target"] == "n2" for a in ctl.api.audit())
    cli(ctl, "breaker", "--reset")
    assert ctl.api.breaker()["tripped"] is False
    cli(ctl, "approve", "n4", expect=3)  # nothing held for n4


def test_the_breaker_closes_once_nothing_is_held_within_the_budget(ctl: Controller) -> None:
    """The drill: the operator cancelled the last held decision and the breaker stayed tripped."""
    fatal(ctl, "n1")
    fatal(ctl, "n2")
    assert ctl.api.breaker()["tripped"] and ctl.api.breaker()["held"] == 1
    cli(ctl, "cancel", "n2", "--reason", "false alarm")
    breaker = cli_json(ctl, "breaker")
    assert breaker == ctl.api.breaker()
    assert (breaker["tripped"], breaker["held"], breaker["reason"]) == (False, 0, "")
    (closed,) = [a for a in ctl.api.audit() if a["action"] == "breaker_closed"]
    assert "within its budget" in closed["detail"] and closed["actor_id"].endswith("admin")
    assert ctl.api.node_state("n2") == "ready"


def test_drain_resume_retire_and_their_refusals(ctl: Controller) -> None:
    out = cli(ctl, "drain", "n4", "--reason", "fan noise")
    assert "n4" in out
    assert ctl.api.node_state("n4") in ("draining", "drained")
    assert any("fan noise" in t["reason"] for t in ctl.api.node("n4")["history"])
    err = cli(ctl, "drain", "n4", expect=4)  # already draining: a conflict, named
    assert "n4" in err
    err = cli(ctl, "repair-complete", "n4", expect=4)  # drained or draining, not in repair: refused, named
    assert "n4" in err and "not in repair" in err, err
    cli(ctl, "retire", "n3")
    assert ctl.api.node_state("n3") == "retired"
    cli(ctl, "resume", "n3", expect=4)
    cli(ctl, "node", "nope", expect=3)
    # Burn-in from the shell, as from the web UI: only a new node (this one is draining), refused by name.
    err = cli(ctl, "burn-in", "n4", "--reason", "racked today", expect=4)
    assert "n4" in err and "only new nodes" in err, err


def burned_in(ctl: Controller, node: str) -> bool:
    """Registered without --ready: the node is new, or its history shows the burn-in it went through."""
    doc = ctl.api.node(node)
    return doc["node"]["state"] == "new" or any(t["to_state"] == "burn_in" for t in doc["history"])


def test_register_adds_nodes_once_and_names_a_bad_id(ctl: Controller) -> None:
    assert cli(ctl, "register", "n5", "n6", "--rack", "r03", "--ready").strip() == "2 registered, 0 already known"
    assert {n: ctl.api.node_state(n) for n in ("n5", "n6")} == {"n5": "ready", "n6": "ready"}
    assert cli_json(ctl, "register", "n6", "n7", "--rack", "r03") == {"registered": 1, "already_known": 1}
    assert burned_in(ctl, "n7") and not burned_in(ctl, "n5")  # burn-in first unless --ready
    assert sorted(n["id"] for n in ctl.api.get("/nodes", rack="r03")) == ["n5", "n6", "n7"]
    err = cli(ctl, "register", "bad/id", "--rack", "r03", expect=2)
    assert "bad/id" in err and "nodes" in err  # the field and the value, as the controller named them
    err = cli(ctl, "register", "n8", "--rack", "r03", token=AGENT_TOKEN, expect=2)
    assert "token" in err and "403" in err  # only an admin registers nodes


def test_register_a_whole_topology_with_its_racks_and_leaf_switches(ctl: Controller, tmp_path: Path) -> None:
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "6")
    racks = topo.racks()
    # each node's leaf switches, read from the file: the far ends of its NICs' ib links
    leaves = {n: {lk["b"] if lk["a"] == nic["id"] else lk["a"] for nic in topo.children(n, "nic")
                  for lk in topo.links_of(nic["id"], "ib")} for n in racks}
    assert len(racks) == 6 and all(leaves.values())
    first = sorted(racks)[:2]
    assert cli_json(ctl, "register", *first, "--topology", str(topo.path)) == {"registered": 2, "already_known": 0}
    out = cli(ctl, "register", "--topology", str(topo.path), "--ready")
    assert out.strip() == "4 registered, 2 already known"
    listed = {n["id"]: n for n in ctl.api.get("/nodes", limit=100) if n["id"] in racks}
    assert set(listed) == set(racks) and {n for n in racks if burned_in(ctl, n)} == set(first)
    for n, v in listed.items():
        assert set(v["domains"]) == {f"rack:{racks[n]}"} | {f"switch:{leaf}" for leaf in leaves[n]}, n
    err = cli(ctl, "register", "r99-n99", "--topology", str(topo.path), expect=2)
    assert "r99-n99" in err and "names" in err
    err = cli(ctl, "register", "n9", expect=2)
    assert "--rack" in err
    err = cli(ctl, "register", "--topology", str(topo.path), "--rack", "r01", expect=2)
    assert "--rack" in err and "--topology" in err


def test_spares_status_without_pools_says_so(ctl: Controller) -> None:
    out = subprocess.run(gpufleet_argv("spares", "--url", ctl.url, "status"), env=child_env(
        {"GPUFLEET_TOKEN": ADMIN_TOKEN}), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and "no spare pools" in out.stdout and "[[spares.pools]]" in out.stdout, out


def test_token_and_connection_errors(ctl: Controller, tmp_path: Path) -> None:
    assert "GPUFLEET_TOKEN" in cli(ctl, "status", token=None, expect=2)
    assert "token" in cli(ctl, "status", token="wrong-token-000000000000", expect=2)
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    out = subprocess.run(gpufleet_argv("fleet", "--url", ctl.url, "--token-file", str(token_file), "status", "--json"),
                         env=child_env(), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["nodes"] == ctl.api.get("/status")["nodes"]
    cli(ctl, "status", url=f"http://127.0.0.1:{free_port()}", expect=5)


def test_time_to_market(ctl: Controller) -> None:
    doc = cli_json(ctl, "ttm")
    assert doc == ctl.api.get("/ttm")
    assert doc["nodes"] == len(NODES) and doc["ready"] == len(NODES) and doc["burned_in"] == 0
    assert [u["share"] for u in cli_json(ctl, "ttm", "--share", "50", "--share", "100")["until"]] == [50, 100]
    table = cli(ctl, "ttm", "--nodes")
    assert "time to market" in table and "100 % of nodes ready after" in table and "0.0 min" in table
    assert all(n in table for n in NODES)  # --nodes: a row per node
    assert "n1" not in cli(ctl, "ttm")


def test_goodput_of_the_cluster_and_its_jobs(ctl: Controller) -> None:
    end = datetime.now(UTC)
    start = end.replace(microsecond=0) - timedelta(minutes=30)
    for job, productive in (("j-big", 1500.0), ("j-small", 600.0)):
        ctl.api.post(f"/jobs/{job}/goodput", {"run": "r1", "world": 8, "intervals": [{
            "start": start.isoformat(), "end": (start + timedelta(minutes=30)).isoformat(),
            "productive_s": productive, "badput_s": {"checkpoint_save": 1800.0 - productive},
            "steps": 100, "step_s": productive, "flops": 1e15, "peak_flops": 1e15}]})
    doc = cli_json(ctl, "goodput", "--since", "2h")
    api = ctl.api.get("/goodput", since=(end - timedelta(hours=2)).isoformat())
    assert doc["cluster"] == api["cluster"] and doc["jobs_total"] == 2
    assert [j["job"] for j in cli_json(ctl, "goodput", "--since", "2h", "--limit", "1")["jobs"]] == [
        api["jobs"][0]["job"]]
    table = cli(ctl, "goodput", "--since", "2h")
    assert "goodput of the cluster" in table and "j-big" in table and "j-small" in table
    assert "checkpoint_save" in table  # the largest badput category is named
    assert "--since" in cli(ctl, "goodput", "--since", "soon", expect=2)


def test_maintenance_plan_sends_every_option_and_a_bad_one_is_named(ctl: Controller) -> None:
    def maint(*args: str, expect: int = 0) -> str:
        out = subprocess.run(gpufleet_argv("maintenance", "--url", ctl.url, *args), capture_output=True, text=True,
                             env=child_env({"GPUFLEET_TOKEN": ADMIN_TOKEN}), timeout=60, check=False)
        assert out.returncode == expect, f"{out.returncode}\n{out.stderr}{out.stdout}"
        return out.stdout if expect == 0 else out.stderr

    planned = json.loads(maint("plan", "--nodes", "n1,n3", "--action", "reboot", "--drain-timeout", "45m",
                               "--validate-timeout", "90m", "--action-timeout", "10m", "--json"))
    stored = ctl.api.get(f"/maintenance/{planned['id']}")  # what the controller keeps, read through the API
    spec = {k: parse_duration(stored["spec"][k]) for k in ("drain_timeout", "validate_timeout", "action_timeout")}
    assert spec == {"drain_timeout": timedelta(minutes=45), "validate_timeout": timedelta(minutes=90),
                    "action_timeout": timedelta(minutes=10)}
    assert sorted(n["node"] for n in stored["nodes"]) == ["n1", "n3"]
    other = json.loads(maint("plan", "--nodes", "n2", "--action", "reboot", "--json"))["id"]
    unset = parse_duration(ctl.api.get(f"/maintenance/{other}")["spec"]["drain_timeout"])
    assert unset != timedelta(minutes=45)  # unset: the controller's default
    # every option left out is the controller's default: the same spec as a bare API plan
    bare = ctl.api.post("/maintenance", {"selector": "nodes:n2", "action": "reboot"})["id"]
    assert ctl.api.get(f"/maintenance/{other}")["spec"] == ctl.api.get(f"/maintenance/{bare}")["spec"]
    err = maint("plan", "--nodes", "n2", "--action", "reboot", "--drain-timeout", "soon", expect=2)
    assert "drain_timeout" in err and "soon" in err
    assert "pxe" in maint("plan", "--help")
