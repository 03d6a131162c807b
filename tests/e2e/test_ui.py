"""The web UI in a real headless Chromium against a live controller process (markers ``e2e`` and ``ui``).

A person signs in with an operator's token, reads the fleet map, opens a node, approves a held decision,
watches the breaker page update by itself, resets the breaker and turns dry run off — each effect is then
read from the API, never from the page that caused it. The controller runs on an 8-node HGX topology
(two racks, one switch domain) with a training job on the simulated scheduler.

Screenshots of each page are taken on the way; with ``GPUFLEET_UI_SCREENSHOTS=docs/ui`` they are written
there (they are the pictures in docs/ui.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.e2e.browser import Browser
from tests.e2e.harness import BASE_POLICY, Controller, Fleet, TopologyFile, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.ui]
OPERATOR_TOKEN = "e2e-operator-" + "d" * 24
OPERATOR = f'\n[[tokens]]\nname = "ops-alice"\nrole = "operator"\ntoken = "{OPERATOR_TOKEN}"\n'
# One node of eight may be out: the second fatal fault trips the breaker and is held.
TIGHT = BASE_POLICY.replace("max_unavailable_fleet = 1.0", "max_unavailable_fleet = 0.15")
RAIL = 5


def leaves_of(topo: TopologyFile, node: str) -> list[str]:
    """The leaf switches the node's NICs are cabled to (from the topology file)."""
    out = set()
    for nic in topo.children(node, "nic"):
        for lk in topo.links_of(nic["id"], "ib"):
            out.add(lk["b"] if lk["a"] == nic["id"] else lk["a"])
    return sorted(out)


def fatal(ctl: Controller, node: str) -> None:
    now = datetime.now(UTC).isoformat()
    ctl.api.post("/events", {"events": [{"id": f"x79-{node}", "node": node, "kind": "xid", "code": 79, "time": now,
                                         "component": f"{node}-gpu3", "message": "GPU has fallen off the bus"}]})


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return Path(os.environ.get("GPUFLEET_UI_SCREENSHOTS") or tmp_path / "screenshots")


@pytest.fixture
def browser(fleet: Fleet) -> Iterator[Browser]:
    b = Browser.start(fleet)
    yield b
    b.close()


def test_an_operator_runs_the_fleet_from_the_browser(fleet: Fleet, browser: Browser, shots: Path,
                                                     tmp_path: Path) -> None:
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "8")
    racks = topo.racks()
    nodes = sorted(racks)
    job = ("1", "llama-8b-pretrain", nodes[4:])
    ctl = fleet.controller(nodes=racks, topology=topo.path, policy=TIGHT, extra_config=OPERATOR,
                           leaves={n: leaves_of(topo, n) for n in nodes}, sim_jobs=[job])
    first, second, third = nodes[0], nodes[1], nodes[5]
    for n in (first, second, third):
        fatal(ctl, n)
    assert ctl.api.breaker()["tripped"] and {d["node"] for d in ctl.api.get("/decisions", status="held")} == {
        second, third}
    ctl.api.post(f"/jobs/{job[0]}/checkpoint", {"time": datetime.now(UTC).isoformat()})
    # The first node has no job: its drain completes on its own a moment after the fault. Let it, so the
    # fleet map and the API read below see one state (a map drawn while it drained said "draining" where
    # the API, read a moment later, said "drained").
    wait_until(lambda: ctl.api.node_state(first) == "drained", lambda: f"{first} drained ({ctl.api.node_state(first)})")
    base = ctl.url

    # Signing in: the fleet map sends a browser without a session to the sign-in page and back.
    browser.goto(f"{base}/")
    assert browser.path() == "/ui/login"
    browser.screenshot(shots / "login.png")
    browser.type("input[name=token]", OPERATOR_TOKEN)
    assert browser.follow("form[action='/ui/login'] button", "the fleet map after signing in") == "/"

    # The fleet map: every node, each tile in the state the API gives it, the held one marked.
    states = {n["id"]: n["state"] for n in ctl.api.get("/nodes")}
    tiles = browser.js("[...document.querySelectorAll('a.tile')].map(a => [a.dataset.node, a.className])")
    assert sorted(t[0] for t in tiles) == nodes
    for node, cls in tiles:
        assert f"s-{states[node]}" in cls.split(), (node, cls, states[node])
    assert {n for n, cls in tiles if "held" in cls.split()} == {second, third}
    assert "switch domain" in browser.text("main").lower() and f"rack {racks[first]}" in browser.text("main")
    browser.screenshot(shots / "fleet.png")

    # A node: its page names the decision that drained it and the fault behind it.
    assert browser.follow(f"a.tile[data-node='{first}']", f"{first}'s page") == f"/ui/nodes/{first}"
    page = browser.text("main")
    assert first in browser.text("h1") and "fatal_event" in page and "fallen off the bus" in page
    assert all(a["kind"] in page for a in ctl.api.actions(first))
    browser.screenshot(shots / "node.png")

    # The held-decision queue: approve the second node's drain.
    assert browser.follow("nav a[href='/ui/held']", "the held decisions") == "/ui/held"
    browser.screenshot(shots / "held.png")
    assert browser.follow(f"tr[data-node='{second}'] button[name=approve]", "approving") == "/ui/held"
    wait_until(lambda: ctl.api.node_state(second) in ("draining", "drained"), f"{second} drained after approval")
    assert {d["node"] for d in ctl.api.get("/decisions", status="held")} == {third}
    assert any(a["action"] == "approve_held" and a["target"] == second and a["actor_id"] == "operator:ops-alice"
               for a in ctl.api.audit())
    assert not browser.exists(f"tr[data-node='{second}']")

    # The breaker page refreshes by itself: dry run switched on through the API shows up without a reload.
    assert browser.follow("nav a[href='/ui/breaker']", "the breaker page") == "/ui/breaker"
    assert "TRIPPED" in browser.text("#breaker-state")
    browser.js("window.__not_reloaded = true")
    r = ctl.api.http.put("/mode", json={"dry_run": True})
    assert r.status_code == 200, r.text
    wait_until(lambda: browser.text("#mode-state .big") == "ON", "the dry-run card to show ON by itself", 20)
    assert browser.js("window.__not_reloaded === true")
    browser.screenshot(shots / "breaker.png")

    # Reset the breaker, discarding what is held; then dry run off again.
    browser.click("input[name=discard_held]")
    assert browser.follow("#reset-breaker", "resetting the breaker") == "/ui/breaker"
    assert ctl.api.breaker() | {"since": None} == {"tripped": False, "reason": "", "since": None, "held": 0,
                                                    "out_in_scheduler": []}
    assert ctl.api.node_state(third) not in ("draining", "drained")
    assert any(a["action"] == "breaker_reset" and a["actor_id"] == "operator:ops-alice" and "discarded" in a["detail"]
               for a in ctl.api.audit())
    assert browser.text("#breaker-state .big") == "closed"
    assert browser.follow("#mode-state button", "turning dry run off") == "/ui/breaker"
    assert ctl.api.get("/mode") == {"dry_run": False}

    # Correlation: three nodes lose their rail-5 link to the same leaf; the verdict names it and the nodes.
    (cable,) = topo.links_of(f"{nodes[2]}-nic{RAIL}", "ib")
    leaf = cable["b"] if cable["a"] == f"{nodes[2]}-nic{RAIL}" else cable["a"]
    now = datetime.now(UTC).isoformat()
    ctl.api.post("/events", {"events": [
        {"id": f"ib-{n}", "node": n, "kind": "link_down", "time": now, "component": f"{n}-nic{RAIL}",
         "link": f"{n}-nic{RAIL}~{leaf}"} for n in (nodes[2], nodes[3], nodes[6])]})
    wait_until(lambda: any(v["component"] == leaf for v in ctl.api.verdicts()), f"a verdict on {leaf}")
    # ...and three other nodes each report ONE symbol error towards the rail-2 leaf: no verdict, but watched.
    weak = (nodes[0], nodes[1], nodes[4])
    (cable2,) = topo.links_of(f"{weak[0]}-nic2", "ib")
    leaf2 = cable2["b"] if cable2["a"] == f"{weak[0]}-nic2" else cable2["a"]
    ctl.api.post("/events", {"events": [
        {"id": f"se-{n}", "node": n, "kind": "link_error", "time": now, "component": f"{n}-nic2",
         "link": topo.links_of(f"{n}-nic2", "ib")[0]["id"]} for n in weak]})
    wait_until(lambda: any(w["component"] == leaf2 for w in ctl.api.get("/verdicts")["watching"]),
               lambda: f"{leaf2} watched: {ctl.api.get('/verdicts')}")
    browser.goto(f"{base}/ui/verdicts")
    row = browser.js(f"[...document.querySelectorAll('tr')].map(r => r.innerText).find(t => t.includes('{leaf}'))")
    verdict = next(v for v in ctl.api.verdicts() if v["component"] == leaf)
    assert row and all(n in row for n in verdict["affected_nodes"]), (row, verdict)
    watched = browser.text(f"tr[data-watched='{leaf2}']")
    assert all(f"{n}-nic2" in watched for n in weak) and "leaf_switch" in watched, watched
    assert not any(v["component"] == leaf2 for v in ctl.api.verdicts())
    assert not browser.exists(f"tr[data-watched='{leaf}']"), "a part with a verdict is not also watched"
    browser.screenshot(shots / "verdicts.png")

    # Jobs: the running job, its nodes and the checkpoint it reported; its goodput timeline.
    t0 = datetime.now(UTC) - timedelta(minutes=30)
    ctl.api.post(f"/jobs/{job[0]}/goodput", {"run": "r1", "world": 8, "intervals": [
        {"start": (t0 + timedelta(minutes=m)).isoformat(), "end": (t0 + timedelta(minutes=m + 10)).isoformat(),
         "productive_s": 600 - lost, "badput_s": {"lost_progress": lost} if lost else {}}
        for m, lost in ((0, 0), (10, 120), (20, 0))]})
    browser.goto(f"{base}/ui/jobs")
    job_row = browser.text(f"tr[data-job='{job[0]}']")
    assert job[1] in job_row and all(n in job_row for n in job[2]) and "never reported" not in job_row
    drawn = browser.js(f"[...document.querySelectorAll('tr[data-goodput-job=\"{job[0]}\"] svg rect')]"
                       ".map(r => [r.getAttribute('class'), r.getBoundingClientRect().width])")
    assert [c for c, _ in drawn] == ["gp-productive", "gp-productive", "gp-lost_progress", "gp-productive"], drawn
    assert all(w > 0 for _, w in drawn), drawn  # laid out by the browser, not just in the markup
    assert drawn[2][1] == pytest.approx(drawn[0][1] * 120 / 600, rel=0.05)  # 2 of 10 minutes lost
    assert "93.3 %" in browser.text(f"tr[data-goodput-job='{job[0]}']")  # ETTR 1,680 s of 1,800 s
    browser.screenshot(shots / "jobs.png")
    browser.type("form.find input[name='find']", "no-such-job")  # the search form: a real GET in the browser
    assert browser.follow("form.find button", "searching the jobs") == "/ui/jobs"
    assert "No job matches." in browser.text("#live") and not browser.exists(f"tr[data-job='{job[0]}']")
    browser.type("form.find input[name='find']", "")
    browser.js("document.querySelector(\"form.find input[name='find']\").value = 'LLAMA'")
    browser.follow("form.find button", "searching the jobs by name")
    assert browser.exists(f"tr[data-job='{job[0]}']") and "1 matching job" in browser.text("#jobs-count")

    # Signing out ends the session: the next page asks to sign in again.
    browser.goto(f"{base}/")
    assert browser.follow("form[action='/ui/logout'] button", "signing out") == "/ui/login"
    browser.goto(f"{base}/ui/held")
    assert browser.path() == "/ui/login"


def test_the_api_docs_render_in_the_browser_from_the_controller_alone(fleet: Fleet, browser: Browser) -> None:
    """Swagger UI draws every route, and every resource the page fetched came from the controller:
    it works on an air-gapped cluster (issue #16)."""
    ctl = fleet.controller(nodes=["r01-n01"])
    paths = len(httpx.get(f"{ctl.url}/openapi.json", timeout=10).json()["paths"])
    browser.goto(f"{ctl.url}/docs")
    drawn = wait_until(lambda: browser.js("document.querySelectorAll('.opblock').length") or None,
                       "Swagger UI drew the operations", 30)
    assert drawn >= paths
    fetched = browser.js("performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched and all(u.startswith(ctl.url) for u in fetched), fetched
