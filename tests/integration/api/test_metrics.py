"""``GET /metrics``: the controller's series agree with what the API itself reports."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.api.conftest import Api, auth, make_api


def scrape(api: Api, who: str = "viewer") -> dict[str, float]:
    """Every sample as ``name{label=value,...}`` -> value (labels sorted)."""
    r = api.client.get("/metrics", headers=auth(who))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_metrics_need_a_token(api: Api) -> None:
    assert api.client.get("/metrics").status_code == 401
    assert api.client.get("/metrics", headers={"Authorization": "Bearer wrong-token-00000000"}).status_code == 401
    for who in ("viewer", "operator", "admin"):
        assert api.client.get("/metrics", headers=auth(who)).status_code == 200
    assert api.client.get("/metrics", headers=auth("agent")).status_code == 403


def test_every_series_carries_the_prefix(api: Api) -> None:
    names = {k.split("{")[0] for k in scrape(api)}
    assert names, "no series at all"
    assert all(n.startswith("gpufleet_") for n in names), sorted(n for n in names if not n.startswith("gpufleet_"))


def test_node_states_and_decisions_match_the_api(api: Api) -> None:
    node = api.nodes[0]
    r = api.post("/v1/events", {"events": [api.event("x1", node, code=79)]}, "agent")
    assert r.status_code == 202, r.text
    m = scrape(api)
    by_state: dict[str, int] = {}
    for state in api.states().values():
        by_state[state] = by_state.get(state, 0) + 1
    for state, n in by_state.items():
        assert m[f"gpufleet_nodes{{state={state}}}"] == n
    assert sum(v for k, v in m.items() if k.startswith("gpufleet_nodes{")) == len(api.nodes)
    decisions = api.get("/v1/decisions")
    assert decisions, "a fatal XID makes a decision"
    for d in decisions:
        assert m[f"gpufleet_decisions_total{{rule={d['rule']},status={d['status']}}}"] >= 1
    assert sum(v for k, v in m.items() if k.startswith("gpufleet_decisions_total")) == len(decisions)
    assert m["gpufleet_ingest_events_total{outcome=accepted}"] == 1
    assert m["gpufleet_ingest_requests_total{code=202,route=events}"] == 1
    assert m["gpufleet_ingest_request_seconds_count{route=events}"] == 1


def test_refused_reports_and_duplicates_are_counted(api: Api) -> None:
    node = api.nodes[1]
    ev = api.event("dup", node, "ecc_sbe", None)
    assert api.post("/v1/events", {"events": [ev]}, "agent").status_code == 202
    assert api.post("/v1/events", {"events": [ev]}, "agent").status_code == 202
    bad = api.post("/v1/events", {"events": [api.event("u1", "no-such-node")]}, "agent")
    assert bad.status_code == 422
    garbled = api.client.post("/v1/events", content=b"{not json", headers=auth("agent") | {
        "content-type": "application/json"})
    assert garbled.status_code == 422
    m = scrape(api)
    assert m["gpufleet_ingest_events_total{outcome=accepted}"] == 1
    assert m["gpufleet_ingest_events_total{outcome=duplicate}"] == 1
    assert m["gpufleet_ingest_batches_refused_total{}"] == 1  # the unknown node reached the writer
    assert m["gpufleet_ingest_requests_total{code=422,route=events}"] == 2
    assert m["gpufleet_ingest_requests_total{code=202,route=events}"] == 2


def test_actions_pass_time_and_detect_to_drain(api: Api) -> None:
    node = api.nodes[2]
    assert api.post("/v1/events", {"events": [api.event("x2", node, code=79)]}, "agent").status_code == 202
    waited = timedelta(seconds=42)
    api.tick(waited)
    api.reconciler.run_once()
    m = scrape(api)
    done = [a for a in api.get("/v1/actions", node=node) if a["status"] == "done"]
    assert done, "the reconciler carried out the drain"
    for a in done:
        assert m[f"gpufleet_actions_total{{kind={a['kind']},outcome=done}}"] >= 1
    drains = [a for a in done if a["kind"].startswith("drain")]
    assert m["gpufleet_detect_to_drain_seconds_count{}"] == len(drains)
    assert m["gpufleet_detect_to_drain_seconds_sum{}"] == pytest.approx(len(drains) * waited.total_seconds())
    assert m["gpufleet_reconciler_pass_seconds_count{}"] == 1
    assert m["gpufleet_scheduler_reachable{}"] == 1


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Api]:
    a = make_api(tmp_path, nodes=20, racks=2)  # fleet budget 2 nodes
    yield a
    a.client.close()
    a.engine.dispose()


def test_breaker_trip_and_held_decisions(fleet: Api) -> None:
    events = [fleet.event(f"b{i}", n, code=79) for i, n in enumerate(fleet.nodes[:6])]
    for ev in events:
        assert fleet.post("/v1/events", {"events": [ev]}, "agent").status_code == 202
    breaker = fleet.get("/v1/breaker")
    assert breaker["tripped"] and breaker["held"] > 0
    m = scrape(fleet)
    assert m["gpufleet_breaker_tripped{}"] == 1
    assert m["gpufleet_breaker_trips_total{}"] == 1
    assert m["gpufleet_held_decisions{}"] == breaker["held"]
    held = fleet.get("/v1/decisions", status="held")
    assert m["gpufleet_decisions_total{rule=fatal_event,status=held}"] == len(held)
    r = fleet.post("/v1/breaker/reset", {"discard_held": True}, "operator")
    assert r.status_code == 200, r.text
    m = scrape(fleet)
    assert m["gpufleet_breaker_tripped{}"] == 0
    assert m["gpufleet_held_decisions{}"] == 0
    assert m["gpufleet_breaker_trips_total{}"] == 1
    assert m["gpufleet_decision_status_changes_total{status=cancelled}"] == len(held)


def test_goodput_series_match_what_jobs_reported_and_per_job_gauges_are_bounded(api: Api) -> None:
    from gpufleet.controller.metrics import MAX_GOODPUT_JOBS
    from tests.integration.api.test_goodput_api import iv

    api.tick(timedelta(hours=2))
    first = {**iv(0, 10, 500, startup=100), "steps": 100, "step_s": 500, "flops": 4e16, "peak_flops": 1e15}
    assert api.post("/v1/jobs/j0/goodput", {"world": 4, "intervals": [first]}, "operator").status_code == 202
    assert api.post("/v1/jobs/j0/goodput", {"world": 4, "intervals": [first]}, "operator").status_code == 202  # again
    m = scrape(api)
    assert m["gpufleet_goodput_seconds_total{category=productive}"] == 500 * 4  # a duplicate counts nothing
    assert m["gpufleet_goodput_seconds_total{category=startup}"] == 100 * 4
    assert m["gpufleet_goodput_model_flops_total{}"] / m["gpufleet_goodput_peak_flops_total{}"] == pytest.approx(0.08)
    assert m["gpufleet_goodput_job_ettr{job=j0}"] == pytest.approx(500 / 600)
    assert m["gpufleet_goodput_job_mfu{job=j0}"] == pytest.approx(0.08)
    for n in range(1, MAX_GOODPUT_JOBS + 5):
        assert api.post(f"/v1/jobs/j{n}/goodput", {"intervals": [iv(0, 10, 600)]}, "operator").status_code == 202
    jobs = {k for k in scrape(api) if k.startswith("gpufleet_goodput_job_ettr{")}
    assert len(jobs) == MAX_GOODPUT_JOBS and "gpufleet_goodput_job_ettr{job=j0}" not in jobs  # the oldest left


def test_the_agents_clock_skew_is_exported_as_in_the_status(api: Api) -> None:
    """Issue #16: skew measured and exported — the gauge and ``/v1/status`` say the same, and it follows
    the agents' latest heartbeats (a fixed clock drops out of it)."""

    def both() -> tuple[float, float]:
        return api.get("/v1/status")["max_clock_skew_s"], scrape(api)["gpufleet_agent_clock_skew_max_seconds{}"]

    def beat(node: str, off: timedelta) -> None:
        r = api.post(f"/v1/nodes/{node}/heartbeat", {"time": (api.clock.now() + off).isoformat()}, "agent")
        assert r.status_code == 200, r.text

    assert both() == (0.0, 0.0)
    beat("r01-n01", -timedelta(hours=1))
    beat("r01-n02", timedelta(seconds=90))
    assert both() == (3600.0, 3600.0)
    api.tick()
    beat("r01-n01", timedelta(0))  # its NTP fixed
    assert both() == (90.0, 90.0)
