from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.push import Backoff, ControllerClient, Pusher
from gpufleet.agent.spool import Spool
from gpufleet.domain import wire
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.inventory import GpuUnit, IbPort, NicUnit, NodeInventory
from tests.unit.agent.controller_double import ControllerDouble

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def ev(i: int, node: str = "n1") -> HealthEvent:
    return HealthEvent(
        id=f"n1:e{i}",
        node=node,
        kind=EventKind.XID,
        time=T0 + timedelta(seconds=i),
        component="n1-gpu0",
        code=79,
        message="x",
    )


@pytest.fixture
def ctl() -> Iterator[ControllerDouble]:
    c = ControllerDouble()
    c.start()
    yield c
    c.stop()


def make(tmp_path: Path, url: str, token: str = "s3cret", **kw: Any) -> tuple[Pusher, Spool, FakeClock]:
    clock = FakeClock()
    spool = Spool(tmp_path / "spool.db")
    pusher = Pusher(
        spool,
        ControllerClient(url, token, timeout_s=5),
        "n1",
        clock,
        backoff=Backoff(1.0, 60.0, random.Random(1)),
        **kw,
    )
    return pusher, spool, clock


def test_pushes_batches_and_heartbeat(tmp_path: Path, ctl: ControllerDouble) -> None:
    pusher, spool, _ = make(tmp_path, ctl.url, batch_size=3)
    spool.put([ev(i) for i in range(7)])
    wait = pusher.step()
    assert len(spool) == 0 and set(ctl.events) == {f"n1:e{i}" for i in range(7)}
    assert pusher.pushed == 7 and pusher.controller_up
    assert ctl.heartbeats[0][0] == "n1" and ctl.heartbeats[0][1]["agent_version"]
    assert datetime.fromisoformat(ctl.heartbeats[0][1]["time"]).tzinfo is not None
    assert wait == pytest.approx(30.0)
    assert ctl.requests == 1 + 3  # heartbeat + ceil(7/3) batches


def test_controller_down_keeps_events_and_backs_off(tmp_path: Path) -> None:
    ctl = ControllerDouble()  # never started: connection refused
    pusher, spool, clock = make(tmp_path, ctl.url)
    spool.put([ev(1), ev(2)])
    w1 = pusher.step()
    assert len(spool) == 2 and not pusher.controller_up and pusher.failures == 1
    assert 0.5 <= w1 <= 1.0
    assert pusher.step() == pytest.approx(w1)  # not due yet: no new attempt
    assert pusher.failures == 1
    clock.advance(w1)
    w2 = pusher.step()
    assert 1.0 <= w2 <= 2.0 and pusher.failures == 2
    ctl.start()
    try:
        clock.advance(w2)
        pusher.step()
        assert len(spool) == 0 and set(ctl.events) == {"n1:e1", "n1:e2"} and pusher.backoff.attempt == 0
    finally:
        ctl.stop()


def test_bad_token_is_retried_never_dropped(
    tmp_path: Path, ctl: ControllerDouble, caplog: pytest.LogCaptureFixture
) -> None:
    pusher, spool, _ = make(tmp_path, ctl.url, token="wrong")
    spool.put([ev(1)])
    pusher.step()
    assert len(spool) == 1 and not ctl.events
    assert "token" in caplog.text and "--token-file" in caplog.text


def test_422_isolates_the_bad_event(tmp_path: Path, ctl: ControllerDouble) -> None:
    pusher, spool, _ = make(tmp_path, ctl.url, batch_size=8)
    spool.put([ev(i) for i in range(5)])
    bad = json.loads(spool.peek(10)[2][1])
    # corrupt one stored event the way a buggy producer might
    spool._db.execute("UPDATE spool SET body=? WHERE id=?", (json.dumps({**bad, "kind": "nonsense"}), bad["id"]))
    pusher.step()
    assert len(spool) == 0 and spool.dropped == 1
    assert set(ctl.events) == {f"n1:e{i}" for i in (0, 1, 3, 4)}


def test_resend_after_lost_ack_is_a_duplicate(tmp_path: Path, ctl: ControllerDouble) -> None:
    pusher, spool, _ = make(tmp_path, ctl.url)
    spool.put([ev(1), ev(2)])
    client = ControllerClient(ctl.url, "s3cret")
    client.post_events([b for _, b in spool.peek(10)])  # delivered, but the agent "crashed" before ack
    pusher.step()
    assert pusher.duplicates == 2 and len(ctl.events) == 2 and ctl.received == 4


def test_5xx_backs_off(tmp_path: Path) -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="overloaded")

    clock = FakeClock()
    spool = Spool(tmp_path / "s.db")
    client = ControllerClient("http://ctl", "t", transport=httpx.MockTransport(handler))
    pusher = Pusher(spool, client, "n1", clock, backoff=Backoff(2.0, 8.0, random.Random(0)))
    spool.put([ev(1)])
    waits = []
    for _ in range(5):
        w = pusher.step()
        waits.append(w)
        clock.advance(w)
    assert all(1.0 <= w <= 2.0 for w in waits[:1]) and all(4.0 <= w <= 8.0 for w in waits[2:])
    assert len(spool) == 1


@given(st.floats(0.01, 10), st.floats(1, 120), st.integers(0, 40), st.integers(0, 2**32))
def test_backoff_bounds(base: float, cap_extra: float, n: int, seed: int) -> None:
    b = Backoff(base, base + cap_extra, random.Random(seed))
    for k in range(n + 1):
        d = min(base + cap_extra, base * 2**k)
        assert d / 2 <= b.next() <= d
    b.reset()
    assert base / 2 <= b.next() <= base


def test_bad_config_is_named() -> None:
    with pytest.raises(InvalidInput, match="controller"):
        ControllerClient("ctl:8080", "t")
    with pytest.raises(InvalidInput, match="backoff"):
        Backoff(0, 1)


def test_wire_body_matches_contract() -> None:
    body = wire.to_wire(
        HealthEvent(id="a", node="n1", kind=EventKind.ECC_DBE, time=T0, component="n1-gpu2", attrs=(("rule", "x"),))
    )
    assert set(body) == {
        "id",
        "node",
        "kind",
        "time",
        "component",
        "code",
        "severity",
        "link",
        "message",
        "source",
        "attrs",
    }
    assert body["time"] == "2026-11-21T12:00:00+00:00" and body["attrs"] == {"rule": "x"}
    assert body["source"] == "agent" and body["kind"] == "ecc_dbe"


def test_unregistered_node_keeps_events_until_registered(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ctl = ControllerDouble(nodes=set())
    ctl.start()
    try:
        pusher, spool, clock = make(tmp_path, ctl.url)
        spool.put([ev(1), ev(2), ev(3)])
        wait = pusher.step()
        assert len(spool) == 3 and spool.dropped == 0 and not ctl.events
        assert "gpufleet fleet register n1 --rack RACK, or POST /v1/nodes" in caplog.text
        assert "refused the heartbeat" in caplog.text
        ctl.nodes = {"n1"}
        clock.advance(wait)
        pusher.step()
        assert len(spool) == 0 and len(ctl.events) == 3
    finally:
        ctl.stop()


# -- the inventory: registered before any event -------------------------------------------------------

INV = NodeInventory("n1", "NODE-1", (GpuUnit(0, "GPU-a", "1650000000001", "0000:18:00.0"),),
                    (NicUnit("mlx5_0", "ibp24s0", "0000:18:00.1", ports=(IbPort(1, "0x1"),)),))


def test_registers_the_inventory_before_any_event(tmp_path: Path, ctl: ControllerDouble) -> None:
    pusher, spool, _ = make(tmp_path, ctl.url, inventory=INV)
    spool.put([ev(1), ev(2)])
    pusher.step()
    assert ctl.paths == ["POST /v1/nodes/n1/heartbeat", "PUT /v1/nodes/n1/inventory", "POST /v1/events"]
    assert ctl.inventories == [INV.to_json()] and len(spool) == 0
    spool.put([ev(3)])
    pusher.step()
    assert ctl.paths[-1] == "POST /v1/events" and len(ctl.inventories) == 1  # once, not per push


def test_events_wait_in_the_spool_until_the_inventory_is_registered(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    ctl = ControllerDouble(nodes={"n2"})  # n1 not registered yet: its inventory is refused with 404
    ctl.start()
    try:
        pusher, spool, clock = make(tmp_path, ctl.url, inventory=INV)
        spool.put([ev(1)])
        wait = pusher.step()
        assert "POST /v1/events" not in ctl.paths and len(spool) == 1
        # the 404 says what to do, at ERROR: the agent cannot fix it and retries for ever meanwhile
        (rec,) = [r for r in caplog.records if "does not know node n1" in r.getMessage()]
        assert rec.levelname == "ERROR" and "gpufleet fleet register n1" in rec.getMessage()
        assert pusher.failures == 1 and pusher.inventory_due and wait > 0
        ctl.nodes = None  # the operator registers the node
        clock.advance(wait)
        pusher.step()
        assert ctl.paths[-2:] == ["PUT /v1/nodes/n1/inventory", "POST /v1/events"] and len(spool) == 0
        assert not pusher.inventory_due and pusher.backoff.attempt == 0
    finally:
        ctl.stop()


def test_a_plain_404_is_not_taken_for_an_unregistered_node(tmp_path: Path, ctl: ControllerDouble,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    pusher, spool, _ = make(tmp_path, ctl.url + "/wrong-prefix")  # a mistyped --controller
    spool.put([ev(1)])
    pusher.step()
    assert len(spool) == 1 and pusher.failures == 1
    assert "push of 1 events failed (404" in caplog.text and "does not know node" not in caplog.text


def test_a_changed_inventory_is_registered_again(tmp_path: Path, ctl: ControllerDouble) -> None:
    pusher, _, _ = make(tmp_path, ctl.url, inventory=INV)
    pusher.step()
    pusher.set_inventory(NodeInventory("n1", "NODE-1", INV.gpus, INV.nics))  # equal: nothing to do
    assert not pusher.inventory_due
    swapped = NodeInventory("n1", "NODE-1", (GpuUnit(0, "GPU-b", "1650000000002", "0000:18:00.0"),), INV.nics)
    pusher.set_inventory(swapped)
    pusher.step()
    assert [d["gpus"][0]["serial"] for d in ctl.inventories] == ["1650000000001", "1650000000002"]
    with pytest.raises(InvalidInput) as err:
        pusher.set_inventory(NodeInventory("n9"))
    assert err.value.field == "inventory.node"


def test_an_inventory_the_controller_can_never_accept_does_not_hold_the_events(
    tmp_path: Path, ctl: ControllerDouble, caplog: pytest.LogCaptureFixture
) -> None:
    bad = NodeInventory("n1", gpus=(GpuUnit(-1),))  # a negative index: 422 naming inventory.gpus[0].index
    pusher, spool, _ = make(tmp_path, ctl.url, inventory=bad)
    spool.put([ev(1)])
    pusher.step()
    assert len(spool) == 0 and ctl.inventories == [] and not pusher.inventory_due
    assert "inventory.gpus[0].index" in caplog.text


def test_a_429_is_honoured_nothing_is_sent_before_its_retry_after(tmp_path: Path) -> None:
    busy = {"on": True}
    posts: list[float] = []
    clock = FakeClock()

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/events":
            posts.append(clock.monotonic())
        if busy["on"]:
            return httpx.Response(429, json={"detail": "ingest queue full"}, headers={"Retry-After": "7"})
        if req.url.path == "/v1/events":
            return httpx.Response(202, json={"accepted": 1, "duplicates": 0, "decisions": 0})
        return httpx.Response(200, json={"status": "ok"})

    spool = Spool(tmp_path / "s.db")
    client = ControllerClient("http://ctl", "t", transport=httpx.MockTransport(handler))
    pusher = Pusher(spool, client, "n1", clock, heartbeat_s=1000.0, backoff=Backoff(0.5, 60.0, random.Random(3)))
    spool.put([ev(1)])
    waits = []
    for _ in range(4):
        w = pusher.step()
        waits.append(w)
        clock.advance(w / 3)  # the loop wakes early (a kick): still nothing may be sent
        w2 = pusher.step()
        clock.advance(w2)
    assert all(7.0 <= w <= 14.0 for w in waits), waits  # never sooner than asked, spread up to twice that
    assert all(b - a >= 7.0 for a, b in itertools.pairwise(posts)), posts
    assert len(spool) == 1
    busy["on"] = False
    clock.advance(15.0)
    pusher.step()
    assert len(spool) == 0


def test_a_409_for_a_reused_id_isolates_that_event_and_the_rest_go_through(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    accepted: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path != "/v1/events":
            return httpx.Response(200, json={"status": "ok"})
        ids = [e["id"] for e in json.loads(req.content)["events"]]
        if "n1:e2" in ids:  # the controller stored another event under this id: never accepted
            return httpx.Response(409, json={"detail": "events[0].id: 'n1:e2' of node 'n1' names another event"})
        accepted.extend(ids)
        return httpx.Response(202, json={"accepted": len(ids), "duplicates": 0, "decisions": 0})

    spool = Spool(tmp_path / "s.db")
    client = ControllerClient("http://ctl", "t", transport=httpx.MockTransport(handler))
    pusher = Pusher(spool, client, "n1", FakeClock(), batch_size=8, backoff=Backoff(1.0, 60.0, random.Random(0)))
    spool.put([ev(i) for i in range(5)])
    pusher.step()
    assert len(spool) == 0 and spool.dropped == 1
    assert sorted(accepted) == ["n1:e0", "n1:e1", "n1:e3", "n1:e4"]
    [drop] = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert "rejected: 409 " in drop and "n1:e2" in drop  # the status the controller gave, not a 422
