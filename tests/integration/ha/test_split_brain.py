"""Split brain: a leader paused (SIGSTOP) past its lease wakes up deposed; nothing it does lands.

Two real replicas on one PostgreSQL with the default lease (8 s, renewed every 2 s). The leader is
stopped; the follower takes over; while it is stopped, a report is sent straight to it, marked as
already forwarded (so it cannot pass it on); then it is woken. It must answer 503 (it no longer leads,
or its write is fenced), the report must not be stored, and it must report itself a follower — while
the new leader goes on deciding.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from gpufleet.controller.api.forward import FORWARDED
from tests.integration.ha.checks import check_invariants
from tests.integration.ha.replicas import HEADERS, Replica, leader, settled

pytestmark = [pytest.mark.ha, pytest.mark.postgres]
LEASE_S, RENEW_S = 8.0, 2.0  # the defaults


@pytest.fixture
def pair(tmp_path: Path, pg_url: str) -> Iterator[list[Replica]]:
    group = [Replica(tmp_path, name, pg_url, LEASE_S, RENEW_S) for name in ("a", "b")]
    yield group
    for r in group:
        r.close()


def event(i: int, node: str) -> dict[str, object]:
    return {"id": f"sb-{i}", "node": node, "kind": "xid", "code": 79, "time": datetime.now(UTC).isoformat(),
            "component": "gpu0"}


def post(r: Replica, events: list[dict[str, object]], **headers: str) -> httpx.Response:
    return httpx.post(f"{r.base}/v1/events", json={"events": events}, headers=HEADERS | headers, timeout=60)


def test_a_paused_leader_that_wakes_after_losing_the_lease_cannot_write(pair: list[Replica], tmp_path: Path,
                                                                        pg_url: str) -> None:
    for r in pair:
        r.start()
    assert all(r.serving() for r in pair)
    old, epoch = settled(pair)
    new = next(r for r in pair if r is not old)
    assert post(new, [event(0, "r01-n001")]).status_code == 202  # via the follower: forwarded to the leader
    old.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    took, new_epoch = leader([new], above=epoch, timeout=30)
    assert took is new and time.monotonic() - stopped < 10 + RENEW_S, "the follower took too long to take over"
    assert post(new, [event(1, "r01-n002")]).status_code == 202  # the new leader decides

    late: dict[str, object] = {}

    def send_to_the_paused_one() -> None:
        try:
            late["answer"] = post(old, [event(2, "r01-n003")], **{FORWARDED: "test"})
        except httpx.TransportError as err:
            late["answer"] = err

    t = threading.Thread(target=send_to_the_paused_one)
    t.start()  # (the kernel queues the connection; the paused process reads it when woken)
    time.sleep(0.5)  # let the request reach the paused process's socket (not a wait for a result)
    old.signal(signal.SIGCONT)
    t.join(timeout=60)
    answer = late["answer"]
    assert isinstance(answer, httpx.Response) and answer.status_code == 503, answer
    deadline = time.monotonic() + 10
    while (h := old.health()) is None or h["role"] != "follower":
        assert time.monotonic() < deadline, f"the woken leader did not step down: {h}"
        time.sleep(0.05)
    metrics = httpx.get(f"{old.base}/metrics", headers=HEADERS, timeout=5).text
    assert "gpufleet_leader 0.0" in metrics and "gpufleet_leader_epoch 0.0" in metrics
    # A follower states its version (a rolling upgrade shows who runs what), not the fleet's state.
    assert "gpufleet_controller_info{version=" in metrics and "gpufleet_nodes{" not in metrics, metrics[-2000:]
    assert (new.health() or {}).get("role") == "leader"
    # Through the deposed one, a report is forwarded to the new leader again.
    assert post(old, [event(3, "r01-n004")]).status_code == 202
    engine = create_engine(pg_url)
    try:
        with engine.connect() as db:
            ids = set(db.scalars(text("select id from events")))
            lease = db.execute(text("select epoch from leader_lease")).scalar_one()
    finally:
        engine.dispose()
    assert "sb-2" not in ids, "a report the deposed leader took was stored"
    assert {"sb-0", "sb-1", "sb-3"} <= ids and lease == new_epoch
    deadline = time.monotonic() + 30
    while True:  # the new leader drains the nodes of the fatal reports it took (and sends them to repair)
        states = {n["id"]: n["state"] for n in httpx.get(f"{new.base}/v1/nodes", headers=HEADERS,
                                                         params={"limit": 1000}, timeout=5).json()}
        if all(states[n] in ("drained", "repair") for n in ("r01-n001", "r01-n002", "r01-n004")):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.1)
    for r in pair:
        r.kill9()
    check_invariants(pg_url, tmp_path, {"sb-0", "sb-1", "sb-3"})
