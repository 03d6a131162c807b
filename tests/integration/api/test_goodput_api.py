"""POST/GET /v1/jobs/{id}/goodput and GET /v1/goodput on the real app and store: idempotent, validated,
bounded, scoped like checkpoints, and the roll-up over a range (hand-checked numbers)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.integration.api.conftest import T0, Api


def iv(start_min: float, minutes: float, productive: float, **badput: float) -> dict[str, Any]:
    """An interval starting ``start_min`` minutes after T0 (seconds for the amounts)."""
    s = T0 + timedelta(minutes=start_min)
    return {"start": s.isoformat(), "end": (s + timedelta(minutes=minutes)).isoformat(),
            "productive_s": productive, "badput_s": badput}


def test_posting_the_same_intervals_again_does_not_double_count(api: Api) -> None:
    api.tick(timedelta(hours=2))
    body = {"run": "r1", "world": 8, "intervals": [iv(0, 10, 500, startup=100), iv(10, 10, 600)]}
    r = api.post("/v1/jobs/j1/goodput", body, "operator")
    assert r.status_code == 202 and r.json() == {"accepted": 2, "duplicates": 0}
    body2 = {"run": "r1", "world": 8, "intervals": [iv(10, 10, 600), iv(20, 10, 300, lost_progress=300)]}
    r = api.post("/v1/jobs/j1/goodput", body2, "operator")
    assert r.status_code == 202 and r.json() == {"accepted": 1, "duplicates": 1}
    got = api.get("/v1/jobs/j1/goodput")
    assert [i["productive_s"] for i in got["intervals"]] == [500, 600, 300]
    assert got["total"]["elapsed_s"] == pytest.approx(1800)
    assert got["total"]["productive_s"] == pytest.approx(1400)
    assert got["total"]["badput_s"]["startup"] == pytest.approx(100)
    assert got["total"]["badput_s"]["lost_progress"] == pytest.approx(300)
    assert got["total"]["ettr"] == pytest.approx(1400 / 1800)


def test_a_stored_interval_with_other_values_is_a_conflict_and_nothing_of_the_batch_is_stored(api: Api) -> None:
    api.tick(timedelta(hours=2))
    assert api.post("/v1/jobs/j1/goodput", {"intervals": [iv(0, 10, 600)]}, "operator").status_code == 202
    r = api.post("/v1/jobs/j1/goodput", {"intervals": [iv(20, 10, 600), iv(0, 10, 500, startup=100)]}, "operator")
    assert r.status_code == 409 and "final" in r.text
    assert [i["start"] for i in api.get("/v1/jobs/j1/goodput")["intervals"]] == [T0.isoformat().replace("+00:00", "Z")]


@pytest.mark.parametrize(("interval", "field"), [
    ({**iv(0, 10, 500)}, "intervals[0]"),  # 500 s counted in a 600 s interval
    ({**iv(0, 10, 600), "end": iv(-5, 1, 0)["start"]}, "intervals[0]"),  # ends before it starts
    ({**iv(0, 10, 600), "productive_s": -1}, "intervals[0].productive_s"),
    ({**iv(0, 10, 600), "badput_s": {"coffee": 1}}, "intervals[0].badput_s.coffee"),
    ({**iv(0, 10, 600), "start": "2026-11-21T12:00:00"}, "intervals[0].start"),
    ({**iv(0, 10, 600), "peak_flops": 0}, "intervals[0].peak_flops"),
])
def test_bad_intervals_are_refused_naming_the_field(api: Api, interval: dict[str, Any], field: str) -> None:
    api.tick(timedelta(hours=2))
    r = api.post("/v1/jobs/j1/goodput", {"intervals": [interval]}, "operator")
    assert r.status_code == 422, r.text
    assert field in [d["field"] for d in r.json()["detail"]], r.text
    assert api.client.get("/v1/jobs/j1/goodput", headers={"Authorization": "Bearer viewer-token-00000001"}
                          ).status_code == 404


def test_a_post_is_bounded_and_an_interval_from_the_future_is_refused(api: Api) -> None:
    api.tick(timedelta(hours=2))
    many = [iv(0.001 * n, 0.001, 0.06) for n in range(1001)]
    r = api.post("/v1/jobs/j1/goodput", {"intervals": many}, "operator")
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "intervals"
    r = api.post("/v1/jobs/j1/goodput", {"intervals": [iv(240, 10, 600)]}, "operator")
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "intervals[0].end"


def test_an_agent_posts_goodput_only_for_jobs_on_its_nodes(api: Api) -> None:
    api.tick(timedelta(hours=2))
    on_r01 = api.scheduler.submit("train-a", ["r01-n01"], start=api.clock.now())
    on_r02 = api.scheduler.submit("train-b", ["r02-n01"], start=api.clock.now())
    body = {"intervals": [iv(0, 10, 600)]}
    assert api.post(f"/v1/jobs/{on_r01.id}/goodput", body, "agent-r01").status_code == 202
    r = api.post(f"/v1/jobs/{on_r02.id}/goodput", body, "agent-r01")
    assert r.status_code == 403 and "r02-n01" in r.text
    assert api.post(f"/v1/jobs/{on_r02.id}/goodput", body, "viewer").status_code == 403


def test_the_roll_up_counts_the_overlap_and_weights_the_cluster_by_world_size(api: Api) -> None:
    api.tick(timedelta(hours=2))
    a = {"world": 8, "intervals": [iv(0, 60, 3000, startup=600)]}
    b = {"world": 2, "intervals": [iv(30, 60, 1800, waiting=1800)]}
    for job, body in (("a", a), ("b", b)):
        assert api.post(f"/v1/jobs/{job}/goodput", body, "operator").status_code == 202
    # the range [T0+30 min, T0+60 min) holds half of a and half of b
    since, until = (T0 + timedelta(minutes=30)).isoformat(), (T0 + timedelta(minutes=60)).isoformat()
    got = api.get("/v1/goodput", since=since, until=until)
    jobs = {j["job"]: j for j in got["jobs"]}
    assert jobs["a"]["elapsed_s"] == pytest.approx(1800) and jobs["a"]["productive_s"] == pytest.approx(1500)
    assert jobs["b"]["elapsed_s"] == pytest.approx(1800) and jobs["b"]["badput_s"]["waiting"] == pytest.approx(900)
    cluster = got["cluster"]
    assert cluster["elapsed_s"] == pytest.approx(1800 * 8 + 1800 * 2)
    assert cluster["productive_s"] == pytest.approx(1500 * 8 + 900 * 2)
    assert cluster["ettr"] == pytest.approx((1500 * 8 + 900 * 2) / (1800 * 10))
    assert got["jobs_total"] == 2 and got["truncated"] is False
    r = api.client.get("/v1/goodput", params={"since": until, "until": since},
                       headers={"Authorization": "Bearer viewer-token-00000001"})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "until"


def test_mfu_rolls_up_as_flops_over_step_time_times_peak(api: Api) -> None:
    api.tick(timedelta(hours=2))
    fast = {**iv(0, 10, 600), "steps": 100, "step_s": 500, "flops": 100 * 4e14, "peak_flops": 1e15}  # 0.08
    slow = {**iv(10, 10, 600), "steps": 50, "step_s": 500, "flops": 50 * 4e14, "peak_flops": 1e15}  # 0.04
    assert api.post("/v1/jobs/j1/goodput", {"intervals": [fast, slow]}, "operator").status_code == 202
    got = api.get("/v1/jobs/j1/goodput")
    assert [i["mfu"] for i in got["intervals"]] == [pytest.approx(0.08), pytest.approx(0.04)]
    assert got["total"]["mfu"] == pytest.approx(150 * 4e14 / (1000 * 1e15))
