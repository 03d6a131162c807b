"""The web UI over the real app and store (no browser): who may see and do what, the CSRF and origin
checks on its forms, the live fragment, and that each page shows what the API says. The browser tests
(tests/e2e/test_ui.py, marker ``ui``) drive the same pages in Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.controller.web.session import COOKIE, csrf_token
from tests.integration.api.conftest import TOKENS, Api, auth, make_api

PAGES = ("/", "/ui/held", "/ui/breaker", "/ui/verdicts", "/ui/jobs", "/ui/nodes/r01-n01")


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Api]:
    # 8 nodes, 2 racks: the default budget (10 %, at least one node) lets one drain through and holds the next.
    a = make_api(tmp_path)
    yield a
    a.client.close()
    a.engine.dispose()


def token(who: str) -> str:
    t = TOKENS[who].token
    assert t is not None
    return t


def sign_in(api: Api, who: str) -> None:
    r = api.client.post("/ui/login", data={"token": token(who), "next": "/ui/held"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/held", r.text
    cookie = r.headers["set-cookie"]
    assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie, cookie


def fatal(api: Api, node: str) -> None:
    r = api.post("/v1/events", {"events": [api.event(f"x79-{node}", node, component=f"{node}-gpu0")]}, "agent")
    assert r.status_code == 202, r.text


def test_pages_need_a_token_and_a_browser_is_sent_to_sign_in(ui: Api) -> None:
    for path in PAGES:
        r = ui.client.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next="), (path, r.status_code)
        assert ui.client.get(path, headers={"X-Gpufleet-Fragment": "1"}).status_code == 401
        assert ui.client.get(path, headers=auth("agent"), follow_redirects=False).status_code == 303  # agents: no UI
        ok = ui.client.get(path, headers=auth("viewer"))
        assert ok.status_code == 200 and "text/html" in ok.headers["content-type"], (path, ok.text[:300])
        assert "script-src 'self'" in ok.headers["content-security-policy"]
    bad = ui.client.post("/ui/login", data={"token": "not-a-token-at-all-0000", "next": "/"}, follow_redirects=False)
    assert bad.status_code == 401 and "not valid" in bad.text
    agent = ui.client.post("/ui/login", data={"token": token("agent"), "next": "/"}, follow_redirects=False)
    assert agent.status_code == 401 and COOKIE not in agent.headers.get("set-cookie", "")


def test_sign_in_goes_only_to_a_path_on_this_server(ui: Api) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        r = ui.client.post("/ui/login", data={"token": token("viewer"), "next": target}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/", target


def test_the_fleet_map_groups_by_switch_domain_and_rack_with_why(ui: Api) -> None:
    fatal(ui, "r01-n01")
    page = ui.client.get("/", headers=auth("viewer")).text
    state = ui.get("/v1/nodes/r01-n01")["node"]["state"]
    reason = ui.get("/v1/nodes/r01-n01")["history"][0]["reason"]
    tile = re.search(r'<a class="tile s-(\w+)[^"]*" href="/ui/nodes/r01-n01"', page)
    assert tile is not None and tile.group(1) == state != "ready"
    assert reason and reason in page
    assert page.index("rack r01") < page.index("rack r02")
    assert len(re.findall(r'class="tile ', page)) == len(ui.nodes)


def test_a_viewer_sees_but_cannot_act(ui: Api) -> None:
    sign_in(ui, "viewer")
    page = ui.client.get("/ui/breaker").text
    assert "Reset the breaker" not in page and "actions need an operator" in page
    r = ui.client.post("/ui/breaker/reset", data={"csrf": csrf_token(token("viewer"))}, follow_redirects=False)
    assert r.status_code == 403 and "may only look" in r.text


def test_a_form_needs_its_csrf_token_and_our_origin(ui: Api) -> None:
    fatal(ui, "r01-n01")
    fatal(ui, "r01-n02")
    assert ui.get("/v1/breaker")["held"] == 1
    sign_in(ui, "operator")
    for data, headers in (({}, {}),
                          ({"csrf": "0" * 64}, {}),
                          ({"csrf": csrf_token(token("operator"))}, {"Origin": "https://evil.example"}),
                          ({"csrf": csrf_token(token("operator"))}, {"Sec-Fetch-Site": "cross-site"})):
        r = ui.client.post("/ui/breaker/reset", data=data, headers=headers, follow_redirects=False)
        assert r.status_code == 403 and "refused" in r.text, (data, headers)
    assert ui.get("/v1/breaker")["tripped"]
    same_site = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    ok = ui.client.post("/ui/breaker/reset", data={"csrf": csrf_token(token("operator")), "discard_held": "on"},
                        headers=same_site, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"] == "/ui/breaker"
    assert ui.get("/v1/breaker") == {"tripped": False, "reason": "", "since": None, "held": 0, "out_in_scheduler": []}
    assert any(a["action"] == "breaker_reset" and a["actor_id"] == "operator:alice" for a in ui.get("/v1/audit"))


def test_approve_and_cancel_held_decisions_from_the_queue(ui: Api) -> None:
    fatal(ui, "r01-n01")
    fatal(ui, "r01-n02")
    fatal(ui, "r02-n01")
    held = {d["node"] for d in ui.get("/v1/decisions", status="held")}
    assert held == {"r01-n02", "r02-n01"}
    queue = ui.client.get("/ui/held", headers=auth("operator")).text
    assert all(f'data-node="{n}"' in queue for n in held) and 'id="held-count"' not in queue
    breaker = ui.client.get("/ui/breaker", headers=auth("viewer")).text
    assert '2 held decisions</a>' in breaker
    csrf = {"csrf": csrf_token(token("operator"))}
    sign_in(ui, "operator")
    r = ui.client.post("/ui/held/approve", data=csrf | {"node": "r01-n02"}, follow_redirects=False)
    assert r.status_code == 303
    assert ui.get("/v1/nodes/r01-n02")["node"]["state"] in ("draining", "drained")
    r = ui.client.post("/ui/held/cancel", data=csrf | {"node": "r02-n01", "reason": "bad batch"},
                       follow_redirects=False)
    assert r.status_code == 303
    assert ui.get("/v1/decisions", status="held") == []
    assert ui.get("/v1/nodes/r02-n01")["node"]["state"] not in ("draining", "drained")
    again = ui.client.post("/ui/held/cancel", data=csrf | {"node": "r02-n01"}, follow_redirects=False)
    assert again.status_code == 404 and "held decision for node" in again.text  # as the API answers


def test_node_operations_and_dry_run_from_forms(ui: Api) -> None:
    sign_in(ui, "operator")
    csrf = {"csrf": csrf_token(token("operator"))}
    r = ui.client.post("/ui/nodes/r02-n03/operate", data=csrf | {"op": "drain", "reason": "fan noise"},
                       follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/nodes/r02-n03"
    assert ui.get("/v1/nodes/r02-n03")["node"]["state"] in ("draining", "drained")
    assert "fan noise" in ui.client.get("/ui/nodes/r02-n03").text
    bad = ui.client.post("/ui/nodes/r02-n03/operate", data=csrf | {"op": "explode"}, follow_redirects=False)
    assert bad.status_code == 422 and "explode" in bad.text
    assert ui.client.post("/ui/nodes/nope/operate", data=csrf | {"op": "drain"}).status_code == 404
    assert ui.client.post("/ui/mode", data=csrf | {"dry_run": "on"}, follow_redirects=False).status_code == 303
    assert ui.get("/v1/mode") == {"dry_run": True}
    assert "dry run" in ui.client.get("/").text


def test_the_node_page_shows_what_the_api_says(ui: Api) -> None:
    fatal(ui, "r01-n01")
    ui.reconciler.run_once()
    page = ui.client.get("/ui/nodes/r01-n01", headers=auth("viewer")).text
    detail = ui.get("/v1/nodes/r01-n01")
    assert detail["events"][0]["id"] and detail["decisions"][0]["rule"] in page
    assert all(a["kind"] in page for a in detail["actions"])
    assert all(t["reason"] in page for t in detail["history"])
    assert ui.client.get("/ui/nodes/nope", headers=auth("viewer")).status_code == 404


def test_the_fragment_is_the_live_part_only(ui: Api) -> None:
    full = ui.client.get("/ui/breaker", headers=auth("viewer")).text
    part = ui.client.get("/ui/breaker", headers=auth("viewer") | {"X-Gpufleet-Fragment": "1"}).text
    assert "<html" in full and "<html" not in part and 'id="breaker-state"' in part


def test_jobs_show_their_last_checkpoint(ui: Api) -> None:
    job = ui.scheduler.submit("train", ["r01-n03", "r01-n04"], start=ui.clock.now())
    page = ui.client.get("/ui/jobs", headers=auth("viewer")).text
    assert f'data-job="{job.id}"' in page and "never reported" in page
    r = ui.post(f"/v1/jobs/{job.id}/checkpoint", {"time": ui.clock.now().isoformat()}, "operator")
    assert r.status_code == 202, r.text
    page = ui.client.get("/ui/jobs", headers=auth("viewer")).text
    assert "never reported" not in page and ui.clock.now().strftime("%Y-%m-%d %H:%M:%S") in page


def test_a_long_queue_shows_a_bounded_page_running_first_and_a_search_finds_any_job(ui: Api) -> None:
    import re

    from gpufleet.controller.web.pages import JOBS_SHOWN

    done = []
    for i in range(JOBS_SHOWN + 50):  # more finished jobs than the page shows
        job = ui.scheduler.submit(f"sweep-{i}", ["r01-n01"], start=ui.clock.now())
        ui.scheduler.finish(job.id)
        done.append(job.id)
    train = ui.scheduler.submit("train", ["r01-n03"], start=ui.clock.now())  # the newest, the only one running
    page = ui.client.get("/ui/jobs", headers=auth("viewer")).text
    rows = re.findall(r'data-job="([^"]+)"', page)
    assert len(rows) == JOBS_SHOWN and rows[0] == train.id
    assert rows[1:] == done[:JOBS_SHOWN - 1]  # then by id, numerically (the sim's ids count up: 9 before 10)
    assert f"Showing {JOBS_SHOWN} of {JOBS_SHOWN + 51} jobs (running first" in page
    row = page[page.index(f'data-job="{train.id}"'):]
    row = row[:row.index("</tr>")]
    stored = ui.controller.store.node("r01-n03")  # the job's node's state, read for the shown jobs' nodes only
    assert stored is not None and f'class="state s-{stored.state}"' in row and "s-unknown" not in row

    page = ui.client.get("/ui/jobs?find=TRAIN", headers=auth("viewer")).text
    assert re.findall(r'data-job="([^"]+)"', page) == [train.id]
    assert f"1 matching job of {JOBS_SHOWN + 51} in the scheduler" in page and 'value="TRAIN"' in page
    page = ui.client.get("/ui/jobs?find=sweep-24", headers=auth("viewer")).text
    expected = [j for i, j in enumerate(done) if f"sweep-{i}".startswith("sweep-24")]
    assert re.findall(r'data-job="([^"]+)"', page) == expected and len(expected) == 11
    page = ui.client.get("/ui/jobs?find=%3Cscript%3E", headers=auth("viewer")).text
    assert "No job matches." in page and "<script>" not in page.split('name="find"')[1][:80]


def test_jobs_show_the_goodput_timeline_of_what_they_reported(ui: Api) -> None:
    import re
    from datetime import timedelta

    from tests.integration.api.test_goodput_api import iv

    page = ui.client.get("/ui/jobs", headers=auth("viewer")).text
    assert "No job has reported goodput" in page
    ui.tick(timedelta(hours=2))
    body = {"intervals": [iv(0, 10, 300, startup=300), iv(20, 10, 450, lost_progress=150)]}  # a gap 10-20 min
    assert ui.post("/v1/jobs/j7/goodput", body, "operator").status_code == 202
    page = ui.client.get("/ui/jobs", headers=auth("viewer")).text
    row = page[page.index('data-goodput-job="j7"'):]
    row = row[:row.index("</tr>")]
    assert "62.5 %" in row  # 750 s productive of 1,200 s reported
    rects = [(c, float(x), float(w)) for c, x, w in
             re.findall(r'<rect class="gp-(\w+)" x="([\d.]+)" y="0" width="([\d.]+)"', row)]
    # 30 minutes across 600 units: 20 units a minute; the gap from minute 10 to 20 stays empty
    assert rects == [("productive", 0, 100), ("startup", 100, 100), ("productive", 400, 150),
                     ("lost_progress", 550, 50)]


def test_assets_are_served_from_the_package(ui: Api) -> None:
    js = ui.client.get("/ui/static/live.js")
    assert js.status_code == 200 and "X-Gpufleet-Fragment" in js.text
    assert ui.client.get("/ui/static/style.css").status_code == 200
    assert ui.client.get("/ui/static/..%2Fsession.py").status_code == 404


def test_more_held_decisions_than_a_page_are_counted_in_full(ui: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.controller.web import pages

    fatal(ui, "r01-n01")
    fatal(ui, "r01-n02")
    fatal(ui, "r02-n01")
    monkeypatch.setattr(pages, "_ALL", 1)  # the page the held queue reads (1,000 in service) holds one here
    queue = ui.client.get("/ui/held", headers=auth("operator")).text
    assert queue.count("data-node=") == 1 and "Showing the newest 1 of 2 held decisions" in queue
    breaker = ui.client.get("/ui/breaker", headers=auth("viewer")).text
    assert '2 held decisions</a>' in breaker  # counted, not the length of a page


def test_the_node_page_shows_each_units_slot_and_the_units_missing_from_the_inventory(ui: Api) -> None:
    gpus = [{"index": i, "serial": f"G{i}", "pci": f"0000:{0x18 + 0x20 * i:02x}:00.0"} for i in range(3)]
    doc = {"format": "gpufleet.inventory/v1", "node": "r01-n01", "gpus": gpus}
    assert ui.client.put("/v1/nodes/r01-n01/inventory", json=doc, headers=auth("agent")).status_code == 200
    short = {**doc, "gpus": [{**g, "index": i} for i, g in enumerate(gpus[1:])]}  # GPU 0 gone: NVML renumbers
    r = ui.client.put("/v1/nodes/r01-n01/inventory", json=short, headers=auth("agent"))
    assert r.status_code == 200 and [m["component"] for m in r.json()["missing"]] == ["r01-n01-gpu0"], r.text
    page = ui.client.get("/ui/nodes/r01-n01", headers=auth("viewer")).text
    missing = re.search(r'<table id="missing-units">.*?</table>', page, re.S)
    assert missing is not None and "r01-n01-gpu0" in missing[0] and gpus[0]["pci"] in missing[0] and "G0" in missing[0]
    rows = re.findall(r"<tr><td>(\d+)</td><td class=\"mono\">([^<]+)</td><td>(G\d)</td>", page)
    assert rows == [("0", "r01-n01-gpu1", "G1"), ("1", "r01-n01-gpu2", "G2")]  # NVML's 0 sits in slot 1
