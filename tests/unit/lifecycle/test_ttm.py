"""Time to market from hand-built histories (expected values worked out by hand in the comments)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.lifecycle.states import NodeState as S
from gpufleet.lifecycle.ttm import NodeHistory, Step, cluster_ttm, node_ttm

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def m(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


HISTORIES = [
    NodeHistory("a", T0, S.IN_SERVICE, ()),  # registered ready: first ready at registration, no burn-in
    NodeHistory("b", T0, S.READY, (Step(m(1), S.NEW, S.BURN_IN), Step(m(31), S.BURN_IN, S.READY))),  # 31 min
    NodeHistory("c", T0, S.READY, (  # burn-in found a fault: repaired, revalidated, ready at 95 min
        Step(m(1), S.NEW, S.BURN_IN), Step(m(20), S.BURN_IN, S.REPAIR), Step(m(80), S.REPAIR, S.REVALIDATE),
        Step(m(95), S.REVALIDATE, S.READY))),
    NodeHistory("d", m(10), S.BURN_IN, (Step(m(11), S.NEW, S.BURN_IN),)),  # still burning in: not ready
    NodeHistory("e", T0, S.REPAIR, (  # ready at registration; a later fault is not a burn-in finding
        Step(m(300), S.READY, S.DRAINING), Step(m(301), S.DRAINING, S.DRAINED), Step(m(302), S.DRAINED, S.REPAIR))),
]


def test_each_node() -> None:
    by = {h.node: node_ttm(h) for h in HISTORIES}
    assert (by["a"].ttm, by["a"].burned_in, by["a"].failures_found) == (timedelta(0), False, 0)
    assert (by["b"].ttm, by["b"].burned_in, by["b"].failures_found) == (timedelta(minutes=31), True, 0)
    assert (by["c"].ttm, by["c"].burned_in, by["c"].failures_found) == (timedelta(minutes=95), True, 1)
    assert (by["d"].first_ready, by["d"].burned_in) == (None, True)
    assert (by["e"].ttm, by["e"].failures_found, by["e"].state) == (timedelta(0), 0, S.REPAIR)


def test_the_cluster() -> None:
    c = cluster_ttm(HISTORIES, (40, 50, 80, 90, 100))
    # 5 nodes; first ready at 0 (a), 0 (e), 31 (b), 95 (c); d never. Started at T0 (the first registration).
    # 40 % = 2 nodes -> 0; 50 % = ceil(2.5) = 3 -> 31 min; 80 % = 4 -> 95 min; 90 % and 100 % = 5 -> not yet
    assert dict(c.until_share) == {40: timedelta(0), 50: timedelta(minutes=31), 80: timedelta(minutes=95),
                                   90: None, 100: None}
    assert (c.nodes, c.ready, c.not_ready, c.started) == (5, 4, ("d",), T0)
    assert (c.burned_in, c.failures_found) == (3, 1)
    assert c.median_burn_in == timedelta(minutes=31)  # b 31, c 95 (d has none yet): the lower median
    doc = c.as_dict(per_node=False)
    assert doc["until"][1] == {"share": 50, "after_s": 1860.0} and doc["per_node"] is None
    assert [n["node"] for n in c.as_dict()["per_node"]] == ["a", "b", "c", "e", "d"]  # by registration


def test_an_empty_fleet_and_bad_shares() -> None:
    empty = cluster_ttm([])
    assert (empty.nodes, empty.started, empty.median_burn_in) == (0, None, None)
    assert all(t is None for _, t in empty.until_share)
    for bad in (0, -5, 101):
        with pytest.raises(InvalidInput) as err:
            cluster_ttm(HISTORIES, (bad,))
        assert err.value.field == "share"
