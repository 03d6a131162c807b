"""The ingest fast path answers exactly as the framework route does, and only serves what it should.

Two controllers, one with the fast path and one without, get the same requests in the same order;
every answer (status and body) and the rows each stores must be the same.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Send
from starlette.types import Scope as ASGIScope

from gpufleet.controller.api.app import create_app
from tests.integration.api.conftest import TOKENS, Api, auth, make_api

JSON = {"content-type": "application/json"}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Api, Api]]:
    (tmp_path / "fast").mkdir()
    (tmp_path / "plain").mkdir()
    fast = make_api(tmp_path / "fast", fast_ingest=True)
    plain = make_api(tmp_path / "plain", fast_ingest=False)
    yield fast, plain
    for a in (fast, plain):
        a.client.close()
        a.engine.dispose()


def _requests(api: Api) -> list[tuple[str, dict[str, str], bytes | None]]:
    """(name, headers, body) of every kind of event post; None body means a chunked upload."""
    now = api.clock.now().isoformat()

    def ev(eid: str, node: str = "r01-n01", **extra: Any) -> dict[str, Any]:
        return {"id": eid, "node": node, "kind": "ecc_sbe", "time": now} | extra

    def body(*events: dict[str, Any]) -> bytes:
        return json.dumps({"events": list(events)}).encode()

    agent, r01 = auth("agent") | JSON, auth("agent-r01") | JSON
    return [
        ("valid", agent, body(ev("e1"), ev("e2", "r02-n01"))),
        ("fatal decides", agent, body(ev("e3", kind="xid", code=79))),
        ("resent: duplicates", agent, body(ev("e1"), ev("e4"))),
        ("unknown node (controller's 422)", agent, body(ev("e5"), ev("e6", "r99-n99"))),
        ("repeated id in batch", agent, body(ev("e7"), ev("e7"))),
        ("scoped token, own nodes", r01, body(ev("e8", "r01-n02"))),
        ("scoped token, other node (403)", r01, body(ev("e9", "r02-n02"))),
        ("viewer may not report (403)", auth("viewer") | JSON, body(ev("e10"))),
        ("no token (401)", JSON, body(ev("e11"))),
        ("wrong token (401)", {"authorization": "Bearer nope"} | JSON, body(ev("e12"))),
        ("schema error (422)", agent, body(ev("e13", kind="bogus"))),
        ("not JSON (422)", agent, b'{"events": ['),
        ("empty batch (422)", agent, b'{"events": []}'),
        ("text/plain", auth("agent") | {"content-type": "text/plain"}, body(ev("e14"))),
        ("application/jsonl (422)", auth("agent") | {"content-type": "application/jsonl"}, body(ev("e16"))),
        ("+json media type", auth("agent") | {"content-type": "application/x.agent+json; charset=utf-8"},
         body(ev("e17"))),
        ("lone surrogate in a bad field (422)", agent, body(ev("e18", kind="\ud800"))),
        ("chunked upload", agent, None),
    ]


def _send(api: Api, headers: dict[str, str], body: bytes | None) -> tuple[int, Any]:
    if body is None:  # no content-length: a streamed body
        now = api.clock.now().isoformat()
        chunks = [b'{"events": [{"id": "e15", "node": "r01-n03", ', f'"kind": "ecc_sbe", "time": "{now}"}}]}}'.encode()]
        r = api.client.post("/v1/events", content=iter(chunks), headers=headers)
    else:
        r = api.client.post("/v1/events", content=body, headers=headers)
    return r.status_code, r.json()


def test_fast_path_and_framework_give_the_same_answers_and_store_the_same_rows(pair: tuple[Api, Api]) -> None:
    fast, plain = pair
    answers = {}
    for name, headers, body in _requests(fast):
        got = _send(fast, headers, body)
        want = _send(plain, headers, body)
        assert got == want, name
        answers[name] = got[0]
    assert answers["valid"] == answers["resent: duplicates"] == answers["chunked upload"] == 202
    assert answers["+json media type"] == 202
    assert answers["application/jsonl (422)"] == answers["lone surrogate in a bad field (422)"] == 422
    assert answers["no token (401)"] == 401 and answers["scoped token, other node (403)"] == 403
    assert fast.rows() == plain.rows()
    assert fast.states() == plain.states()
    counts = fast.app.state.fast_ingest
    # The fast path served exactly the well-formed, authorised posts; the framework saw everything else.
    served = {"valid", "fatal decides", "resent: duplicates", "unknown node (controller's 422)",
              "repeated id in batch", "scoped token, own nodes", "+json media type"}
    assert counts.served == len(served)
    assert counts.passed_on == len(_requests(fast)) - len(served)
    assert plain.app.state.fast_ingest.served == 0


def test_the_fast_path_answer_matches_the_documented_schema(pair: tuple[Api, Api]) -> None:
    fast, _ = pair
    now = fast.clock.now().isoformat()
    r = fast.client.post("/v1/events", json={"events": [{"id": "s1", "node": "r01-n01", "kind": "xid", "code": 79,
                                                         "time": now}]}, headers=auth("agent"))
    assert r.status_code == 202
    assert r.headers["content-type"] == "application/json"
    schema = fast.client.get("/openapi.json").json()["components"]["schemas"]["IngestOut"]
    assert set(r.json()) == set(schema["properties"]) == set(schema["required"])
    assert r.json() == {"accepted": 1, "duplicates": 0, "decisions": 1}
    assert TOKENS["agent"].role == "agent"


def test_a_repeated_authorization_header_is_read_as_the_framework_reads_it(pair: tuple[Api, Api]) -> None:
    good = TOKENS["agent"].token
    assert good is not None
    answers = []
    for api in pair:
        now = api.clock.now().isoformat()
        body = json.dumps({"events": [{"id": "h1", "node": "r01-n01", "kind": "ecc_sbe", "time": now}]})
        headers = [("authorization", "Bearer not-a-valid-token"), ("authorization", f"Bearer {good}"),
                   ("content-type", "application/json")]
        r = api.client.post("/v1/events", content=body.encode(), headers=headers)
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1]
    assert answers[0][0] == 401


def test_heartbeats_fast_and_framework_answer_alike(pair: tuple[Api, Api]) -> None:
    fast, plain = pair
    agent, r01 = auth("agent") | JSON, auth("agent-r01") | JSON
    cases: list[tuple[str, str, dict[str, str], bytes]] = []
    for api in pair:
        now = api.clock.now().isoformat()
        ok = json.dumps({"time": now, "agent_version": "1.2.3"}).encode()
        cases = [
            ("valid", "r01-n01", agent, ok),
            ("scoped token, own node", "r01-n02", r01, ok),
            ("scoped token, other node (403)", "r02-n01", r01, ok),
            ("unknown node (404)", "r99-n99", agent, ok),
            ("no timezone (422)", "r01-n01", agent, b'{"time": "2026-11-21T12:00:00"}'),
            ("extra field (422)", "r01-n01", agent, json.dumps({"time": now, "colour": "red"}).encode()),
            ("viewer (403)", "r01-n01", auth("viewer") | JSON, ok),
            ("no token (401)", "r01-n01", JSON, ok),
            ("a node id with a slash: no such route (404)", "r01/n01", agent, ok),
        ]
    served_before = fast.app.state.fast_ingest.served
    answers = {}
    for name, node, headers, body in cases:
        got = [api.client.post(f"/v1/nodes/{node}/heartbeat", content=body, headers=headers) for api in pair]
        fast_answer, plain_answer = [(r.status_code, r.json()) for r in got]
        assert fast_answer == plain_answer, name
        answers[name] = got[0].status_code
    assert answers["valid"] == answers["scoped token, own node"] == 200
    assert answers["unknown node (404)"] == 404
    assert fast.app.state.fast_ingest.served - served_before == 3  # valid, own node, unknown node
    for api in pair:
        node = api.get("/v1/nodes/r01-n01")["node"]
        assert node["agent_version"] == "1.2.3"
        assert node["last_heartbeat"] is not None
    assert fast.get("/v1/nodes/r01-n02")["node"] == plain.get("/v1/nodes/r01-n02")["node"]


def test_a_middleware_added_after_the_fast_path_still_sees_its_requests(tmp_path: Path) -> None:
    """Issue #16 feared the fast path "bypasses any middleware added later". Starlette puts each later
    ``add_middleware`` (and FastAPI's ``@app.middleware("http")``) outside the ones before it, so a
    middleware added to the finished app wraps the fast path: it sees, and may refuse, what the fast path
    serves."""
    api = make_api(tmp_path)
    app = create_app(api.controller, tuple(TOKENS.values()), api.reconciler)  # fast path on, not started yet
    seen: list[tuple[str, str]] = []

    class Audit:  # a pure ASGI middleware
        def __init__(self, inner: ASGIApp) -> None:
            self.inner = inner

        async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                seen.append((scope["method"], scope["path"]))
            await self.inner(scope, receive, send)

    app.add_middleware(Audit)

    @app.middleware("http")
    async def tag(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.headers.get("x-refuse") == "1":
            return JSONResponse({"detail": "refused by a later middleware"}, status_code=418)
        response = await call_next(request)
        response.headers["x-seen-by"] = "later-middleware"
        return response

    now = api.clock.now().isoformat()
    with TestClient(app) as client:
        counts = app.state.fast_ingest
        event = {"events": [{"id": "m1", "node": "r01-n01", "kind": "ecc_sbe", "time": now}]}
        r = client.post("/v1/events", json=event, headers=auth("agent"))
        beat = client.post("/v1/nodes/r01-n02/heartbeat", json={"time": now}, headers=auth("agent"))
        assert (r.status_code, beat.status_code) == (202, 200), (r.text, beat.text)
        assert counts.served == 2 and counts.passed_on == 0  # both answered by the fast path ...
        assert r.headers["x-seen-by"] == beat.headers["x-seen-by"] == "later-middleware"  # ... inside the later ones
        assert seen == [("POST", "/v1/events"), ("POST", "/v1/nodes/r01-n02/heartbeat")]
        again = dict(event, events=[dict(event["events"][0], id="m2")])
        refused = client.post("/v1/events", json=again, headers=auth("agent") | {"x-refuse": "1"})
        assert refused.status_code == 418 and counts.served == 2  # refused before the fast path saw it
    assert api.rows()["events"] == 1
    api.client.close()
    api.engine.dispose()
