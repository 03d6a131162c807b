"""Bounds on a request before anything reads it: header size, body size, and the time to send the body.

The outermost ASGI middleware of the API. Without it a caller with no token could send a 300 MB body
(held in memory until the 401) or trickle bodies in slowly to hold the server's memory and tasks. Here
every request with a body has its body read up to ``max_body_bytes`` within ``read_timeout_s``, then
replayed to the app (the app reads the whole body anyway); past either bound the answer is 413 or 408
and the connection's request is dropped unread. Headers past ``max_header_bytes`` get a 431. Each
refusal is logged with the peer address and counted (:class:`RefusedCounts`, shown by ``/v1/status``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = 64 * 1024 * 1024  # a batch of 10,000 events with long messages fits
    max_header_bytes: int = 16 * 1024
    read_timeout_s: float = 30.0  # from the first byte of the body to the last


DEFAULT_LIMITS = Limits()


class RefusedCounts(Counter[str]):
    """Requests refused before the app saw them, by reason (``body_too_large``, ``read_timeout``, ...),
    and by the API for its callers (``unauthenticated``, ``forbidden``, ``overloaded``)."""


class RequestLimits:
    def __init__(self, app: ASGIApp, limits: Limits, counts: RefusedCounts) -> None:
        self.app, self.limits, self.counts = app, limits, counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lim = self.limits
        header_bytes = sum(len(k) + len(v) + 4 for k, v in scope["headers"])
        if header_bytes > lim.max_header_bytes:
            await self._refuse(scope, send, 431, "header_too_large",
                               f"headers: {header_bytes} bytes, expected at most {lim.max_header_bytes}")
            return
        length = _content_length(scope)
        if length is not None and length > lim.max_body_bytes:
            await self._refuse(scope, send, 413, "body_too_large",
                               f"body: {length} bytes, expected at most {lim.max_body_bytes}")
            return
        if scope["method"] in ("GET", "HEAD", "OPTIONS") and length in (None, 0):
            await self.app(scope, receive, send)
            return
        try:
            async with asyncio.timeout(lim.read_timeout_s):  # a deadline on this task: no task of its own
                body, more = await read_body(receive, lim.max_body_bytes)
        except TimeoutError:
            await self._refuse(scope, send, 408, "read_timeout",
                               f"body: not complete within {lim.read_timeout_s:g} s")
            return
        if body is None:
            await self._refuse(scope, send, 413, "body_too_large",
                               f"body: more than {lim.max_body_bytes} bytes")
            return
        await self.app(scope, replay(body, more, receive), send)

    async def _refuse(self, scope: Scope, send: Send, status: int, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        peer = scope.get("client") or ("?", 0)
        log.warning("refused %s %s from %s: %s", scope["method"], scope["path"][:200], peer[0], detail)
        payload = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def read_body(receive: Receive, limit: int | None = None) -> tuple[bytes | None, bool]:
    """The whole body (None when it passes ``limit``), and whether something other than a body chunk
    (a disconnect) came before its end."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None, False
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


def replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """A ``receive`` that hands out the body already read, then carries on with the real one."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return again
