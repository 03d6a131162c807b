"""GET /v1/jobs/{id}/events for a job on many nodes, on SQLite and PostgreSQL: the statements one request
sends do not grow with the job's nodes (they were three per node), and the answer on a generated mix of
events, transitions and actions — ties in time, kinds, nodes, other nodes' rows, rows outside the range,
transitions whose times do not follow their order — is the one the node-by-node reads gave, computed
here from the inserted rows."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, event, insert, select

from gpufleet.controller.store.models import ActionRow, EventRow, TransitionRow
from tests.conftest import require_service
from tests.integration.api.conftest import T0, Api, make_api
from tests.integration.store.backends import WHAT, Postgres

BACKENDS = [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres", marks=pytest.mark.postgres)]
START = T0 + timedelta(days=1)  # the generated rows' hour: after the nodes' registration


def _api(backend: str, tmp_path: Path, postgres: Postgres | None, nodes: int, racks: int) -> Iterator[Api]:
    if backend == "sqlite":
        a = make_api(tmp_path, nodes, racks)
    else:
        require_service(postgres is not None, WHAT)
        assert postgres is not None
        with postgres.database(migrated=False) as url:
            a = make_api(tmp_path, nodes, racks, database_url=url)
            try:
                yield a
            finally:
                a.client.close()
                a.engine.dispose()
            return
    try:
        yield a
    finally:
        a.client.close()
        a.engine.dispose()


@pytest.fixture(params=BACKENDS)
def big(request: pytest.FixtureRequest, tmp_path: Path, postgres: Postgres | None) -> Iterator[Api]:
    """310 nodes in 2 racks (r01-n01 .. r01-n155, r02-n01 .. r02-n155)."""
    yield from _api(request.param, tmp_path, postgres, 310, 2)


@pytest.fixture(params=BACKENDS)
def small(request: pytest.FixtureRequest, tmp_path: Path, postgres: Postgres | None) -> Iterator[Api]:
    """12 nodes in 2 racks (r01-n01 .. r01-n06, r02-n01 .. r02-n06)."""
    yield from _api(request.param, tmp_path, postgres, 12, 2)


class Statements:
    """The SQL statements the engine sends while the block runs."""

    def __init__(self, api: Api) -> None:
        self.engine, self.sent = api.engine, list[str]()

    def __enter__(self) -> Statements:
        event.listen(self.engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        self.sent.append(statement)


def _fill(api: Api, nodes: list[str], seed: int, *, events: int, transitions: int, actions: int) -> None:
    """Replace every event, transition and action with a random mix on ``nodes`` over START .. START + 2 h,
    at few distinct times (ties), of few kinds; the transitions' times in random order of their seq."""
    rng = random.Random(seed)
    times = [START + timedelta(minutes=rng.randrange(0, 120)) for _ in range(12)]
    with api.engine.begin() as conn:
        for table in (EventRow, TransitionRow, ActionRow):
            conn.execute(delete(table))
        if events:
            conn.execute(insert(EventRow), [
                {"id": f"e{i:04d}", "node": rng.choice(nodes), "kind": rng.choice(("xid", "ecc_sbe", "aer_corrected")),
                 "time": rng.choice(times), "severity": rng.choice(("fatal", "degraded", "info")),
                 "component": None, "code": rng.choice((None, 79, 48)), "message": f"event {i}", "source": "agent",
                 "attrs": {"n": i}, "received": START} for i in range(events)])
        if transitions:
            conn.execute(insert(TransitionRow), [
                {"node": rng.choice(nodes), "from_state": "ready", "to_state": rng.choice(("draining", "repair")),
                 "time": rng.choice(times), "reason": f"transition {i}", "actor": "policy", "actor_id": "p",
                 "evidence": []} for i in range(transitions)])
        if actions:
            conn.execute(insert(ActionRow), [
                {"id": f"a{rng.randrange(10_000):04d}x{i:04d}", "decision_id": "d", "node": rng.choice(nodes),
                 "kind": rng.choice(("drain", "requeue_jobs")), "reason": f"action {i}", "status": "done",
                 "next_attempt": START, "created": rng.choice(times), "updated": START} for i in range(actions)])


Row = tuple[datetime, str, str, str, str]  # time, node, source, kind, message (unique per row)


def _expected(api: Api, nodes: list[str], lo: datetime, hi: datetime, limit: int) -> tuple[list[Row], bool]:
    """What the node-by-node reads answered, from the stored rows: per node and table its newest limit + 1
    in [lo, hi) (events: time then seq, newest first; transitions: seq, highest first; actions: time
    newest first, then id), all merged in node order, sorted newest first by (time, node, source, kind)
    keeping that order among ties, the first ``limit`` listed oldest first."""
    with api.engine.connect() as conn:
        ev = [(r.time, r.seq, r) for r in conn.execute(select(EventRow))]
        tr = [(r.time, r.seq, r) for r in conn.execute(select(TransitionRow))]
        ac = [(r.created, r.id, r) for r in conn.execute(select(ActionRow))]
    merged: list[Row] = []
    for n in sorted(set(nodes)):
        def mine(rows: list[tuple[datetime, Any, Any]]) -> list[tuple[datetime, Any, Any]]:
            return [x for x in rows if x[2].node == n and lo <= x[0] < hi]  # noqa: B023 (used at once)
        newest_ev = sorted(mine(ev), key=lambda x: (x[0], x[1]), reverse=True)[:limit + 1]
        newest_tr = sorted(mine(tr), key=lambda x: x[1], reverse=True)[:limit + 1]
        by_id = sorted(mine(ac), key=lambda x: x[1])  # id ascending, then (stable) time descending
        newest_ac = sorted(by_id, key=lambda x: x[0], reverse=True)[:limit + 1]
        merged += [(t, n, "event", r.kind, r.message) for t, _, r in newest_ev]
        merged += [(t, n, "transition", r.to_state, r.reason) for t, _, r in newest_tr]
        merged += [(t, n, "action", r.kind, r.reason) for t, _, r in newest_ac]
    merged.sort(key=lambda x: x[:4], reverse=True)
    return merged[:limit][::-1], len(merged) > limit


def _got(doc: dict[str, Any]) -> list[Row]:
    return [(datetime.fromisoformat(e["time"]), e["node"], e["source"], e["kind"], e["message"])
            for e in doc["events"]]


def test_a_request_sends_the_same_few_statements_for_10_nodes_as_for_300(big: Api) -> None:
    _fill(big, big.nodes, 1, events=1240, transitions=310, actions=310)  # 6 rows a node on average
    window = {"since": START.isoformat(), "until": (START + timedelta(hours=3)).isoformat()}
    counts: dict[str, int] = {}
    for size, nodes in ((10, big.nodes[:10]), (300, big.nodes[10:])):
        job = big.scheduler.submit(f"train-{size}", nodes, start=T0)
        with Statements(big) as sql:
            doc = big.get(f"/v1/jobs/{job.id}/events", **window)
        assert doc["nodes"] == sorted(nodes) and doc["events"] and doc["truncated"] == (size == 300)
        counts[f"{size} nodes"] = len(sql.sent)
        with Statements(big) as sql:  # the nodes named (at most 256)
            named = big.get(f"/v1/jobs/{job.id}/events", node=doc["nodes"][:256], **window)
        assert named["events"]
        counts[f"{min(size, 256)} nodes named"] = len(sql.sent)
    # one statement per table whatever the nodes (node by node: 3 per node, 30 / 900 / 768)
    assert set(counts.values()) == {3}, counts


@pytest.mark.parametrize("seed", range(4))
def test_the_answer_is_the_node_by_node_one_on_a_generated_mix(small: Api, seed: int) -> None:
    rng = random.Random(seed)
    job_nodes = small.nodes[1:5] + small.nodes[7:10]  # r01-n02 .. r01-n05, r02-n02 .. r02-n04
    _fill(small, small.nodes, seed, events=160, transitions=70, actions=70)
    job = small.scheduler.submit("train", job_nodes, start=T0)
    for _ in range(6):
        lo = START + timedelta(minutes=rng.randrange(-10, 60))
        hi = lo + timedelta(minutes=rng.randrange(1, 130))
        limit = rng.choice((1, 2, 3, 5, 8, 13, 40, 500))
        window = {"since": lo.isoformat(), "until": hi.isoformat(), "limit": limit}
        want, cut = _expected(small, job_nodes, lo, hi, limit)
        doc = small.get(f"/v1/jobs/{job.id}/events", **window)
        assert (_got(doc), doc["truncated"], doc["nodes"]) == (want, cut, sorted(job_nodes)), window
        named = rng.sample(small.nodes, 4) + small.nodes[:1]  # r01-n01 twice, maybe not the job's: as asked
        doc = small.get(f"/v1/jobs/{job.id}/events", node=named, **window)
        assert (_got(doc), doc["truncated"]) == _expected(small, named, lo, hi, limit), window
        # a tenant sees its own nodes' part (acme: rack r01)
        doc = small.get(f"/v1/jobs/{job.id}/events", "acme-viewer", **window)
        mine = [n for n in job_nodes if n.startswith("r01-")]
        assert (_got(doc), doc["truncated"], doc["nodes"]) == (*_expected(small, mine, lo, hi, limit), mine)
