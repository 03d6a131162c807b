"""The hot path of the agents' posts — ``POST /v1/events`` and ``POST /v1/nodes/{node}/heartbeat`` —
for well-formed requests from authorised agents, without the framework.

Agents' posts are nearly all of the controller's traffic (12,500 nodes reporting every 10 s and
beating every 30 s are 1,667 requests a second), and routing, dependency injection and response
validation cost more CPU per request than the work itself. This ASGI middleware answers the common
case directly — a valid bearer token whose role may report, a JSON body that validates as an
:class:`EventBatch` (or a :class:`HeartbeatIn`), every node one the token may report for — with
exactly what the FastAPI route would answer. Anything else (a missing or wrong token, a body that
does not validate, a chunked or very large body, another route) goes on to the framework unchanged,
with the body it already read replayed, so every error is still produced by one piece of code, and
the routes stay in the OpenAPI document.

A middleware added after this one (``app.add_middleware``, ``@app.middleware("http")``) wraps it and
sees every request it serves, as Starlette puts each later middleware outside the earlier ones
(test_ingest_fast_path.py); an app- or router-level dependency, which runs at routing, never runs
for the requests answered here, so a check every report must pass belongs in a middleware.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from gpufleet.controller.ingest import GroupCommitter
from gpufleet.controller.service import Heartbeat
from gpufleet.domain.errors import GpufleetError

from . import errors
from .auth import REPORT, Caller, TokenRegistry, authenticate
from .limits import read_body, replay
from .schemas import EventBatch, HeartbeatIn

log = logging.getLogger(__name__)

MAX_FAST_BODY = 16 * 1024 * 1024  # larger bodies take the framework's path (nothing is read here)
_EVENTS = "/v1/events"


@dataclass
class FastPathCounts:
    """How many event posts the fast path answered, and how many it left to the framework."""

    served: int = 0
    passed_on: int = 0


class IngestFastPath:
    def __init__(self, app: ASGIApp, committer: GroupCommitter, tokens: TokenRegistry,
                 counts: FastPathCounts | None = None) -> None:
        self.app = app
        self.committer = committer
        self.tokens = tokens
        self.counts = counts if counts is not None else FastPathCounts()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:  # the first of a repeated header, as Starlette reads it
            headers.setdefault(name, value)
        length = headers.get(b"content-length")
        caller = self._reporter(headers.get(b"authorization", b""))
        if (caller is None or length is None or not length.isdigit() or int(length) > MAX_FAST_BODY
                or not _is_json(headers.get(b"content-type", b""))):
            self.counts.passed_on += 1
            await self.app(scope, receive, send)
            return
        got, more = await read_body(receive)
        body = got or b""
        if not more:
            try:
                self.committer.check_room()  # a full queue refuses before the body is parsed
            except GpufleetError as err:
                self.counts.served += 1
                await errors.response_for(err)(scope, receive, send)
                return
        work = None if more else (_batch(body, caller) if route == _EVENTS else _beat(body, caller, route))
        if work is None:
            self.counts.passed_on += 1
            await self.app(scope, replay(body, more, receive), send)
            return
        self.counts.served += 1
        try:
            if isinstance(work, Heartbeat):
                await asyncio.wrap_future(self.committer.submit_heartbeat(work))
                payload = b'{"status":"ok"}'
                status = 200
            else:
                r = await asyncio.wrap_future(self.committer.submit([e.to_domain() for e in work.events]))
                payload = json.dumps({"accepted": r.accepted, "duplicates": r.duplicates,
                                      "decisions": r.decisions}, separators=(",", ":")).encode()
                status = 202
        except GpufleetError as err:
            await errors.response_for(err)(scope, receive, send)
            return
        await _send_json(send, status, payload)

    def _reporter(self, authorization: bytes) -> Caller | None:
        """The caller behind a valid bearer token whose role may report events, else None."""
        caller = authenticate(self.tokens, authorization.decode("latin-1"))
        # a tenant-scoped token takes the framework's route, where its tenant's nodes are checked (api/scope.py)
        return caller if isinstance(caller, Caller) and caller.role in REPORT and caller.tenant is None else None


def _is_json(content_type: bytes) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters ignored: what FastAPI parses."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


def _route(scope: Scope) -> str | None:
    """``_EVENTS``, the node of a heartbeat post, or None for every other request."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path: str = scope["path"]
    if path == _EVENTS:
        return _EVENTS
    if path.startswith("/v1/nodes/") and path.endswith("/heartbeat"):
        node = path[len("/v1/nodes/"):-len("/heartbeat")]
        return node if node and "/" not in node else None
    return None


def _beat(body: bytes, caller: Caller, node: str) -> Heartbeat | None:
    try:
        beat = HeartbeatIn.model_validate_json(body)
    except ValidationError:
        return None
    return Heartbeat(node, beat.time, beat.agent_version) if caller.may_report_for(node) else None


def _batch(body: bytes, caller: Caller) -> EventBatch | None:
    """The body as a batch ``caller`` may send, or None (the framework then says what is wrong)."""
    try:
        batch = EventBatch.model_validate_json(body)
    except ValidationError:
        return None
    return batch if all(caller.may_report_for(e.node) for e in batch.events) else None


async def _send_json(send: Send, status: int, payload: bytes) -> None:
    start: dict[str, Any] = {"type": "http.response.start", "status": status,
                             "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(payload)).encode())]}
    await send(start)
    await send({"type": "http.response.body", "body": payload})
