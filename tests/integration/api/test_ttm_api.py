"""``GET /v1/ttm`` over real transitions: two delivered nodes burn in (one fails first), eight were
registered ready; the figures are worked out from the times this test sets."""

from __future__ import annotations

from datetime import timedelta

from tests.integration.api.conftest import Api, auth


def _burn_in_result(api: Api, node: str, eid: str, passed: bool) -> None:
    kind = "check_passed" if passed else "check_failed"
    r = api.post("/v1/events", {"events": [api.event(eid, node, kind=kind, code=None, source="check",
                                                      message="burn-in soak", attrs={"check": "burnin"})]},
                 "agent")
    assert r.status_code == 202, r.text
    api.reconciler.run_once()


def test_time_to_market_per_node_and_for_the_cluster(api: Api) -> None:
    started = api.clock.now() - timedelta(seconds=1)  # make_api registered the 8 ready nodes one tick ago
    r = api.post("/v1/nodes", {"state": "new", "nodes": [{"id": "r03-n01", "rack": "r03"},
                                                          {"id": "r03-n02", "rack": "r03"}]})
    assert r.status_code == 201, r.text
    delivered = api.clock.now()
    api.reconciler.run_once()  # auto_burn_in: both start burn-in
    assert api.states()["r03-n01"] == "burn_in" and api.states()["r03-n02"] == "burn_in"

    api.tick(timedelta(minutes=30))
    _burn_in_result(api, "r03-n01", "bi-1", passed=True)  # ready 30 min after delivery
    api.tick(timedelta(minutes=10))
    _burn_in_result(api, "r03-n02", "bi-2", passed=False)  # burn-in finds a fault
    assert api.states()["r03-n02"] not in ("ready", "burn_in")

    doc = api.get("/v1/ttm", share=[80, 90, 100])
    assert (doc["nodes"], doc["ready"], doc["not_ready"]) == (10, 9, ["r03-n02"])
    assert (doc["burned_in"], doc["failures_found"]) == (2, 1)
    per = {n["node"]: n for n in doc["per_node"]}
    assert per["r03-n01"]["ttm_s"] == 1800 and per["r03-n01"]["burned_in"] is True
    assert per["r01-n01"]["ttm_s"] == 0 and per["r01-n01"]["burned_in"] is False
    assert per["r03-n02"]["first_ready"] is None and per["r03-n02"]["failures_found"] == 1
    # 80 % = 8 nodes: the 8 ready at registration; 90 % = 9: r03-n01, 30 min after delivery; 100 %: not yet
    until = {u["share"]: u["after_s"] for u in doc["until"]}
    assert until[80] == 0
    assert until[90] == (delivered + timedelta(minutes=30) - started).total_seconds()
    assert until[100] is None
    assert doc["median_burn_in_s"] == 1800
    assert api.get("/v1/ttm", nodes=False)["per_node"] is None


def test_bad_shares_are_refused_naming_the_field(api: Api) -> None:
    r = api.client.get("/v1/ttm", params={"share": 0}, headers=auth("viewer"))
    assert r.status_code == 422 and "share" in r.text
    assert api.client.get("/v1/ttm").status_code == 401
