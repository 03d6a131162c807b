"""The hot path of ``POST /v1/events``: well-formed reports from authorised agents, without the framework.

Event ingest is nearly all of the controller's traffic (12,500 nodes reporting every 10 s are 1,250
requests a second), and routing, dependency injection and response validation cost more CPU per
request than the ingest itself. This ASGI middleware answers the common case directly — a valid bearer
token whose role may report, a JSON body that validates as an :class:`EventBatch`, every node one the
token may report for — with exactly what the FastAPI route would answer. Anything else (a missing or
wrong token, a body that does not validate, a chunked or very large body, another route) goes on to
the framework unchanged, with the body it already read replayed, so every error is still produced
by one piece of code, and the route stays in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.controller.ingest import GroupCommitter
from gpufleet.domain.errors import GpufleetError

from . import errors
from .auth import REPORT, Caller, TokenRegistry
from .schemas import EventBatch

log = logging.getLogger(__name__)

MAX_FAST_BODY = 16 * 1024 * 1024  # larger bodies take the framework's path (nothing is read here)
_PATH = "/v1/events"


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
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != _PATH:
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:  # the first of a repeated header, as Starlette reads it
            headers.setdefault(name, value)
        length = headers.get(b"content-length")
        caller = self._reporter(headers.get(b"authorization", b""))
        if (caller is None or length is None or not length.isdigit() or int(length) > MAX_FAST_BODY
                or not headers.get(b"content-type", b"").startswith(b"application/json")):
            self.counts.passed_on += 1
            await self.app(scope, receive, send)
            return
        body, more = await _read(receive)
        batch = None if more else _batch(body, caller)
        if batch is None:
            self.counts.passed_on += 1
            await self.app(scope, _replay(body, more, receive), send)
            return
        self.counts.served += 1
        try:
            r = await asyncio.wrap_future(self.committer.submit([e.to_domain() for e in batch.events]))
        except GpufleetError as err:
            await errors.response_for(err)(scope, receive, send)
            return
        payload = json.dumps({"accepted": r.accepted, "duplicates": r.duplicates, "decisions": r.decisions})
        await _send_json(send, 202, payload.encode())

    def _reporter(self, authorization: bytes) -> Caller | None:
        """The caller behind a valid bearer token whose role may report events, else None."""
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        caller = self.tokens.caller(token.strip())
        return caller if caller is not None and caller.role in REPORT else None


def _batch(body: bytes, caller: Caller) -> EventBatch | None:
    """The body as a batch ``caller`` may send, or None (the framework then says what is wrong)."""
    try:
        batch = EventBatch.model_validate_json(body)
    except ValidationError:
        return None
    return batch if all(caller.may_report_for(e.node) for e in batch.events) else None


async def _read(receive: Receive) -> tuple[bytes, bool]:
    """The whole body, or what arrived before something other than a body chunk (then ``more``)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """A ``receive`` that hands out the body already read, then carries on with the real one."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return again


async def _send_json(send: Send, status: int, payload: bytes) -> None:
    start: dict[str, Any] = {"type": "http.response.start", "status": status,
                             "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(payload)).encode())]}
    await send(start)
    await send({"type": "http.response.body", "body": payload})
