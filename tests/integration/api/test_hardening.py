"""Regression tests for the defects an outside review reproduced against a running controller (issue #16)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from gpufleet.controller.api.app import create_app
from gpufleet.controller.api.limits import Limits
from gpufleet.controller.settings import Role, TokenConfig
from gpufleet.controller.store.db import tables
from tests.integration.api.conftest import BACKENDS, TOKENS, Api, api_on, auth, make_api

JSON = {"content-type": "application/json"}


def _one_422(r: Any) -> dict[str, Any]:
    assert r.status_code == 422, r.text
    (d,) = r.json()["detail"]
    assert set(d) == {"field", "value", "expected"}
    return dict(d)


# ---- no 5xx on bad input ---------------------------------------------------------------------------
def test_an_invalid_value_over_200_characters_is_a_422_showing_it_cut(api: Api) -> None:
    r = api.post("/v1/events", {"events": [api.event("e1", "r01-n01") | {"kind": "k" * 5000}]}, "agent")
    d = _one_422(r)
    assert d["field"] == "events[0].kind"
    assert d["value"].startswith("kkk") and d["value"].endswith("...") and len(d["value"]) < 300


def test_a_422_says_what_was_expected_in_the_projects_words_not_the_librarys(api: Api) -> None:
    d = _one_422(api.post("/v1/events", {"events": [api.event("e1", "r01-n01") | {"time": "2026-11-21T12:00:00"}]},
                          "agent"))
    assert d["field"] == "events[0].time" and d["expected"].startswith("time must include a timezone"), d


@pytest.mark.parametrize("when", ["9999-12-31T23:00:00-05:00", "0001-01-01T00:30:00+01:00"])
def test_a_time_outside_the_utc_calendar_is_a_422(api: Api, when: str) -> None:
    d = _one_422(api.post("/v1/events", {"events": [api.event("e1", "r01-n01") | {"time": when}]}, "agent"))
    assert (d["field"], d["value"]) == ("events[0].time", when)
    d = _one_422(api.client.get("/v1/events", params={"since": when}, headers=auth("viewer")))
    assert (d["field"], d["value"]) == ("since", when)


def test_an_offset_past_a_64_bit_integer_is_a_422(api: Api) -> None:
    d = _one_422(api.client.get("/v1/events", params={"offset": str(2**63)}, headers=auth("viewer")))
    assert (d["field"], d["value"]) == ("offset", str(2**63))


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "1e400", "9" * 5000])
def test_a_code_that_is_not_an_integer_json_can_carry_is_a_4xx_never_a_5xx(api: Api, raw: str) -> None:
    event = json.dumps({"id": "n1", "node": "r01-n01", "kind": "xid", "time": api.clock.now().isoformat()})
    body = '{"events": [' + event[:-1] + ', "code": ' + raw + "}]}"
    r = api.client.post("/v1/events", content=body.encode(), headers=auth("agent") | JSON)
    assert 400 <= r.status_code < 500, r.text
    assert api.rows()["events"] == 0


@pytest.mark.parametrize(("method", "path", "body", "field"), [
    ("POST", "/v1/nodes/r01-n01/drain", {"reason": "a\u0000b"}, "reason"),
    ("POST", "/v1/nodes", {"nodes": [{"id": "r05-n01", "rack": "r\u000005"}]}, "nodes[0].rack"),
    ("POST", "/v1/held/approve", {"component": "leaf\u0000"}, "component"),
    ("PUT", "/v1/nodes/r01-n01/inventory", {"node": "r01-n01", "serial": "S\u0000"}, "inventory.serial"),
    ("GET", "/v1/nodes?rack=r%0001", None, "rack"),
    ("GET", "/v1/nodes/r01%00n01", None, "node"),
    ("GET", "/v1/audit?target=a%00", None, "target"),
    ("POST", "/v1/jobs/" + "j" * 129 + "/checkpoint", {"time": "2026-11-21T12:00:00Z"}, "job_id"),
    ("POST", "/v1/nodes", {"nodes": [{"id": "r05-n01", "rack": "r" * 129}]}, "nodes[0].rack"),
    ("PUT", "/v1/nodes/r01-n01/inventory", {"node": "r01-n01", "serial": "S" * 201}, "inventory.serial"),
])
def test_nul_and_over_long_text_in_any_field_is_a_422_naming_it(db_api: Api, method: str, path: str, body: Any,
                                                                   field: str) -> None:
    """On both databases (issue #16: on PostgreSQL only, these got 500/503 from the database)."""
    before = db_api.rows()
    content = None if body is None else json.dumps(body).encode()
    d = _one_422(db_api.client.request(method, path, content=content, headers=auth("admin") | JSON))
    assert d["field"] == field
    assert db_api.rows() == before


@contextmanager
def _write_lock(api: Api, backend: str) -> Iterator[None]:
    """Another connection holds the database's write lock, as a backup tool, a migration or a stray
    ``sqlite3``/``psql`` shell would: reads go on, every write waits for the lock and is refused."""
    if backend == "sqlite":
        assert api.engine.url.database is not None
        holder = sqlite3.connect(api.engine.url.database, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # WAL mode: other connections can read, none can write
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    with api.engine.connect() as conn, conn.begin():
        names = ", ".join(f'"{t}"' for t in tables(api.engine))
        conn.execute(text(f"LOCK TABLE {names} IN EXCLUSIVE MODE"))  # plain reads still go on
        yield


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_the_database_refuses_is_a_503_without_the_sql_or_what_was_sent(tmp_path: Path,
                                                                                backend: str) -> None:
    """Issue #16: a 503 body carried the SQL statement and its parameters (SQLAlchemy appends both to its
    errors' text). The failure here is the database's own: its write lock is held by another connection."""
    secret = "ticket-SECRET-7f3a"
    with api_on(backend, tmp_path, lock_wait_ms=300) as api:
        event = api.event("e1", "r01-n01", kind="ecc_sbe", code=None, message=secret, component=secret)
        with _write_lock(api, backend):
            answers = {"event post": api.post("/v1/events", {"events": [event]}, "agent"),
                       "drain": api.post("/v1/nodes/r01-n02/drain", {"reason": secret}, "operator")}
        for what, r in answers.items():
            assert r.status_code == 503, (what, r.text)
            detail = r.json()["detail"]
            assert detail.startswith("database") and "lock" in detail.lower(), (what, detail)  # the driver's reason
            for leak in ("[SQL:", "INSERT", "UPDATE", "parameters", secret, "r01-n01"):
                assert leak not in r.text, (what, leak, r.text)
        assert api.rows()["events"] == 0
        # the lock gone, the same requests go through: it was the lock that refused them
        assert api.post("/v1/events", {"events": [event]}, "agent").status_code == 202
        assert api.post("/v1/nodes/r01-n02/drain", {"reason": secret}, "operator").status_code == 200


@pytest.mark.parametrize(("path", "params", "field", "names"), [
    ("/v1/events", {"kind": "bogus"}, "kind", ("xid", "link_error")),
    ("/v1/decisions", {"status": "approved-ish"}, "status", ("held", "applied")),
])
def test_an_unknown_filter_value_is_a_422_listing_the_known_ones(api: Api, path: str, params: dict[str, str],
                                                                  field: str, names: tuple[str, ...]) -> None:
    """Not an empty answer: a typo'd filter must not read as "nothing happened"."""
    d = _one_422(api.client.get(path, params=params, headers=auth("viewer")))
    assert (d["field"], d["value"]) == (field, params[field])
    assert all(n in d["expected"] for n in names), d
    ok = api.client.get(path, params={field: names[0]}, headers=auth("viewer"))
    assert ok.status_code == 200, ok.text


# ---- node-scoped identity ------------------------------------------------------------------------------
def test_an_agent_token_must_name_its_nodes() -> None:
    with pytest.raises(ValueError, match="nodes"):
        TokenConfig(name="agents", role=Role.AGENT, token="agent-token-000000009")
    assert TokenConfig(name="agents", role=Role.AGENT, token="agent-token-000000009", nodes=("*",)).nodes == ("*",)


def test_an_agent_reports_checkpoints_only_for_jobs_on_its_nodes(api: Api) -> None:
    on_r01 = api.scheduler.submit("train-a", ["r01-n01", "r01-n02"], start=api.clock.now())
    on_r02 = api.scheduler.submit("train-b", ["r02-n01"], start=api.clock.now())
    when = {"time": api.clock.now().isoformat()}
    assert api.post(f"/v1/jobs/{on_r01.id}/checkpoint", when, "agent-r01").status_code == 202
    r = api.post(f"/v1/jobs/{on_r02.id}/checkpoint", when, "agent-r01")
    assert r.status_code == 403 and "r02-n01" in r.text
    assert api.post("/v1/jobs/no-such-job/checkpoint", when, "agent-r01").status_code == 404
    assert api.post(f"/v1/jobs/{on_r02.id}/checkpoint", when, "operator").status_code == 202
    assert api.controller.store.last_checkpoint([on_r02.id]) is not None


def test_a_checkpoint_dated_in_the_future_beyond_the_skew_is_refused(api: Api) -> None:
    job = api.scheduler.submit("train-a", ["r01-n01"], start=api.clock.now())
    far = api.clock.now() + api.controller.max_clock_skew + timedelta(seconds=1)
    d = _one_422(api.post(f"/v1/jobs/{job.id}/checkpoint", {"time": far.isoformat()}, "operator"))
    assert d["field"] == "time"
    assert api.controller.store.last_checkpoint([job.id]) is None
    near = api.clock.now() + api.controller.max_clock_skew
    assert api.post(f"/v1/jobs/{job.id}/checkpoint", {"time": near.isoformat()}, "operator").status_code == 202


# ---- limits before authentication, backpressure ------------------------------------------------------
def _limited(tmp_path: Path, limits: Limits, **kw: Any) -> Api:
    a = make_api(tmp_path)
    a.app = create_app(a.controller, tuple(TOKENS.values()), a.reconciler, limits=limits, **kw)
    from fastapi.testclient import TestClient

    a.client = TestClient(a.app)
    return a


def test_an_unauthenticated_oversized_body_is_refused_before_it_is_read(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    api = _limited(tmp_path, Limits(max_body_bytes=1000))
    with caplog.at_level(logging.WARNING, "gpufleet.controller.api.limits"):
        r = api.client.post("/v1/events", content=b"x" * 5000, headers=JSON)
    assert r.status_code == 413 and "1000" in r.text
    assert api.app.state.refused["body_too_large"] == 1
    assert "refused POST /v1/events" in caplog.text
    # A streamed body (no content-length): reading stops at the bound, long before its end.
    reads, sent = [], []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 500, "more_body": len(reads) < 100}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/events", "headers": [], "client": ("10.0.0.9", 1)}
    asyncio.run(api.app(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 413
    assert len(reads) == 3


def test_a_body_sent_too_slowly_is_refused_with_408(tmp_path: Path) -> None:
    api = _limited(tmp_path, Limits(read_timeout_s=0.05))
    sent = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the rest of the body never comes
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/events", "client": ("10.0.0.9", 1),
             "headers": [(b"content-length", b"100")]}
    asyncio.run(api.app(scope, receive, send))  # type: ignore[arg-type]
    assert sent[0]["status"] == 408
    assert api.app.state.refused["read_timeout"] == 1


def test_oversized_headers_are_refused(tmp_path: Path) -> None:
    api = _limited(tmp_path, Limits(max_header_bytes=2000))
    r = api.client.get("/v1/health", headers=auth("viewer") | {"x-padding": "p" * 3000})
    assert r.status_code == 431
    assert api.client.get("/v1/health", headers=auth("viewer")).status_code == 200


@pytest.mark.parametrize("fast", [True, False])
def test_a_full_ingest_queue_answers_429_with_retry_after(tmp_path: Path, fast: bool) -> None:
    api = make_api(tmp_path, fast_ingest=fast)
    committer = api.app.state.ingest
    committer.max_queued_events = 3
    with api.controller.lock:  # the writer cannot take a round: the queue fills
        first = committer.submit([])  # something queued, so the bound applies
        committer.queued = 3
        r = api.post("/v1/events", {"events": [api.event("q1", "r01-n01", "ecc_sbe", None)]}, "agent")
        beat = api.post("/v1/nodes/r01-n01/heartbeat", {"time": api.clock.now().isoformat()}, "agent")
    assert first is not None
    assert r.status_code == 429 and beat.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert "queue full" in r.json()["detail"]
    assert committer.refused == 2


def test_a_full_queue_refuses_before_the_body_is_parsed(tmp_path: Path) -> None:
    """The fast path asks for room before parsing: a refusal costs a read, not a validation (a body that
    would be a 422 is a 429 while the queue is full, and a 422 again once it has room)."""
    api = make_api(tmp_path, fast_ingest=True)
    committer = api.app.state.ingest
    committer.max_queued_events = 3
    bad = {"events": [{"id": "b1", "node": "r01-n01", "kind": "xid", "code": "not-a-number", "time": "x"}]}
    with api.controller.lock:
        committer.submit([])
        committer.queued = 3
        full = api.post("/v1/events", bad, "agent")
    assert full.status_code == 429 and committer.refused == 1
    committer.queued = 0
    assert api.post("/v1/events", bad, "agent").status_code == 422


def test_refused_requests_are_counted_in_the_status(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "gpufleet.controller.api.auth"):
        assert api.client.get("/v1/nodes").status_code == 401
        assert api.client.get("/v1/nodes", headers={"authorization": "Bearer nope"}).status_code == 401
        assert api.post("/v1/nodes/r01-n01/drain", {}, "viewer").status_code == 403
    assert "refused GET /v1/nodes from testclient: unauthenticated" in caplog.text
    refused = api.get("/v1/status")["refused"]
    assert (refused["unauthenticated"], refused["forbidden"], refused["overloaded"]) == (2, 1, 0)


def test_the_docs_pages_load_every_script_from_the_controller_itself(api: Api) -> None:
    import re

    assert api.client.get("/redoc").status_code == 404  # ReDoc fetches its logo from a CDN: not served
    for page in ("/docs",):
        r = api.client.get(page)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        urls = re.findall(r"""(?:src|href)\s*[=:]\s*['"]([^'"]+)['"]""", r.text)
        assert urls, r.text
        assert all(u.startswith(("/docs/assets/", "/openapi.json")) for u in urls), urls  # no CDN, no fonts
        assert "cdn." not in r.text and "fonts.googleapis" not in r.text
        for u in urls:
            if u.startswith("/docs/assets/"):
                asset = api.client.get(u)
                assert asset.status_code == 200 and len(asset.content) > 1000, u
    js = api.client.get("/docs/assets/swagger-ui-bundle.js")
    assert "javascript" in js.headers["content-type"] and b"SwaggerUIBundle" in js.content


def test_the_openapi_document_can_require_a_token_and_the_docs_can_be_off(tmp_path: Path) -> None:
    api = _limited(tmp_path, Limits(), openapi_requires_auth=True)
    assert api.client.get("/openapi.json").status_code == 401
    doc = api.client.get("/openapi.json", headers=auth("viewer"))
    assert doc.status_code == 200 and "/v1/events" in doc.json()["paths"]
    assert api.client.get("/docs").status_code == 404
    assert api.client.get("/docs/assets/swagger-ui.css").status_code == 404
    (tmp_path / "x").mkdir()
    plain = _limited(tmp_path / "x", Limits(), api_docs=False)
    assert plain.client.get("/docs").status_code == 404 and plain.client.get("/redoc").status_code == 404
    assert plain.client.get("/openapi.json").status_code == 200


def test_the_openapi_422_schema_is_the_body_the_api_sends(api: Api) -> None:
    schemas = api.client.get("/openapi.json").json()["components"]["schemas"]
    entry = schemas["ValidationError"]
    r = api.post("/v1/events", {"events": []}, "agent")
    (sent,) = r.json()["detail"]
    assert set(sent) == set(entry["properties"]) == set(entry["required"])
    assert schemas["HTTPValidationError"]["properties"]["detail"]["items"]["$ref"].endswith("/ValidationError")


@pytest.mark.parametrize("when", [12345, 1764331200.5])
def test_a_time_sent_as_a_number_is_a_422_not_a_date_in_1970(api: Api, when: float) -> None:
    """An operations drill: ``"time": 12345`` was read as Unix time, stored as 1970 with a 202 and judged stale."""
    d = _one_422(api.post("/v1/events", {"events": [api.event("e1", "r01-n01") | {"time": when}]}, "agent"))
    assert d["field"] == "events[0].time" and "not a number" in d["expected"], d
    assert api.rows()["events"] == 0


def test_an_event_dated_past_the_allowed_clock_skew_is_a_422_and_nothing_of_its_batch_is_stored(api: Api) -> None:
    """A drill: an event stamped 2099 was accepted and sat atop every newest-first list for good."""
    ahead = (api.clock.now() + timedelta(days=1, minutes=1)).isoformat()
    good = api.event("e1", "r01-n01")
    d = _one_422(api.post("/v1/events", {"events": [good, api.event("e2", "r01-n01") | {"time": ahead}]}, "agent"))
    assert (d["field"], d["value"]) == ("events[1].time", ahead) and "a day" in d["expected"], d
    assert api.rows()["events"] == 0
    within = (api.clock.now() + timedelta(hours=2)).isoformat()  # a fast clock not yet measured: kept
    r = api.post("/v1/events", {"events": [good, api.event("e3", "r01-n01") | {"time": within}]}, "agent")
    assert r.status_code == 202 and r.json()["accepted"] == 2, r.text


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/mode", {"dry_run": "yes"}, "dry_run"),
    ("/v1/mode", {"dry_run": 1}, "dry_run"),
    ("/v1/breaker/reset", {"discard_held": "no"}, "discard_held"),
])
def test_a_fleet_wide_switch_takes_only_a_json_boolean(api: Api, path: str, body: dict[str, object],
                                                      field: str) -> None:
    """An operations drill: {"dry_run": "yes"} turned dry-run on and {"discard_held": "no"} was read as
    false, where a numeric string for an event's code is refused."""
    method = api.client.put if path == "/v1/mode" else api.client.post
    r = method(path, json=body, headers=auth("operator"))
    assert r.status_code == 422, r.text
    assert [d["field"] for d in r.json()["detail"]] == [field]
    assert api.client.get("/v1/mode", headers=auth("viewer")).json() == {"dry_run": False}, "nothing changed"


def test_an_unknown_action_status_is_a_422_naming_the_statuses(api: Api) -> None:
    """A drill: ?status=faild answered 200 [], telling an operator nothing failed."""
    d = _one_422(api.client.get("/v1/actions", params={"status": "faild"}, headers=auth("viewer")))
    assert (d["field"], d["value"]) == ("status", "faild") and "failed" in d["expected"], d
    assert api.client.get("/v1/actions", params={"status": "failed"}, headers=auth("viewer")).status_code == 200
