"""GET /v1/jobs/{id}/events on the real app and store: the health events, drains and checkpoint requests on
a job's nodes (named, or the scheduler's), in a time range, bounded, and bad input named."""

from __future__ import annotations

from datetime import timedelta

from tests.integration.api.conftest import T0, Api


def _xid_on_n01_and_noise_elsewhere(api: Api) -> None:
    """r01-n01: an XID 79 (fatal: the node is drained); r01-n02: a corrected ECC error; r02-n01 (not the
    job's): an XID 79 of its own."""
    body = {"events": [api.event("j-0", "r01-n01", "xid", 79), api.event("j-1", "r01-n02", "ecc_sbe", None),
                       api.event("j-2", "r02-n01", "xid", 79)]}
    r = api.post("/v1/events", body, "agent")
    assert r.status_code == 202, r.text


def test_the_jobs_nodes_from_the_scheduler_give_their_events_drains_and_nothing_from_other_nodes(api: Api) -> None:
    job = api.scheduler.submit("train", ["r01-n01", "r01-n02"], start=T0)
    api.tick()
    _xid_on_n01_and_noise_elsewhere(api)
    api.tick()
    got = api.get(f"/v1/jobs/{job.id}/events")
    assert got["nodes"] == ["r01-n01", "r01-n02"] and got["truncated"] is False
    rows = got["events"]
    assert {r["node"] for r in rows} == {"r01-n01", "r01-n02"}
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)  # oldest first
    kinds = {(r["node"], r["source"], r["kind"]) for r in rows}
    assert ("r01-n01", "event", "xid") in kinds and ("r01-n02", "event", "ecc_sbe") in kinds
    # the XID drained r01-n01 (the job runs there: the drain waits for its checkpoint) and says why
    drains = [r for r in rows if r["node"] == "r01-n01" and r["source"] in ("transition", "action")]
    assert drains, rows
    assert any(r["source"] == "action" and r["kind"].startswith("drain") for r in drains), drains
    xid = next(r for r in rows if r["kind"] == "xid")
    assert xid["severity"] == "fatal" and xid["code"] == 79 and xid["attrs"]["event_id"] == "j-0"
    assert not any(r["source"] == "event" and r["node"] == "r01-n02" and r["severity"] == "fatal" for r in rows)


def test_named_nodes_and_a_time_range_bound_the_list(api: Api) -> None:
    _xid_on_n01_and_noise_elsewhere(api)
    later = api.tick(timedelta(minutes=10))
    r = api.post("/v1/events", {"events": [api.event("j-3", "r01-n02", "ecc_sbe", None)]}, "agent")
    assert r.status_code == 202
    api.tick()
    # a finished job is not the scheduler's any more: its nodes are named
    got = api.get("/v1/jobs/gone/events", node=["r01-n02"], since=later.isoformat())
    assert [(r["node"], r["kind"], r["attrs"]["event_id"]) for r in got["events"]] == [("r01-n02", "ecc_sbe", "j-3")]
    first = api.get("/v1/jobs/gone/events", node=["r01-n01", "r01-n02"], until=later.isoformat(), limit=2)
    assert first["truncated"] is True and len(first["events"]) == 2  # the newest two of those before `later`
    everything = api.get("/v1/jobs/gone/events", node=["r01-n01", "r01-n02"], until=later.isoformat())
    assert first["events"] == everything["events"][-2:]


def test_unknown_nodes_and_bad_ranges_are_named(api: Api) -> None:
    viewer = {"Authorization": "Bearer viewer-token-00000001"}
    r = api.client.get("/v1/jobs/nope/events", headers=viewer)
    assert r.status_code == 404 and "?node=" in r.text
    since = (T0 + timedelta(hours=1)).isoformat()
    r = api.client.get("/v1/jobs/j/events", headers=viewer, params={"node": "r01-n01", "since": since,
                                                                    "until": T0.isoformat()})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "until", r.text
    r = api.client.get("/v1/jobs/j/events", headers=viewer, params={"node": "r01-n01", "since": "yesterday"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "since", r.text
    r = api.client.get("/v1/jobs/j/events", headers=viewer, params=[("node", f"n{i}") for i in range(300)])
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "node", r.text
