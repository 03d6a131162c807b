"""Admission in the HTTP protocol, before a request reaches the app: a deadline for its headers, and a
cap on agents' reports in flight.

Uvicorn bounds an idle keep-alive connection, and :mod:`limits` bounds the body once the app is called,
but nothing bounds the time *before* the app is called: a client that opens a connection and sends half
a request line (or one header byte a minute) holds a socket and a protocol object for ever. A thousand
such clients held a test controller's sockets for as long as they liked (issue #16). This protocol —
uvicorn's own httptools protocol with one timer added — starts a clock when a connection opens and when
each request on it begins, stops it when the request's headers are complete, and closes the connection
with a 408 when it runs out. Each such close is logged with the peer address and counted as
``header_timeout`` among the refused requests (``/v1/status``, ``gpufleet_requests_refused_total``).

The cap: when more than ``max_inflight`` requests are already being handled, a new agent report
(``POST /v1/events``, a heartbeat) is answered 429 with ``Retry-After`` as soon as its headers are in —
before its body is read or parsed, so refusing costs almost nothing and the reports already admitted
keep the event loop (docs/benchmarks.md §overload: a bound on the ingest queue alone did not bound the
wait, which happened before the queue). Operators' and viewers' requests are never refused here.
Counted as ``inflight``. The connection stays open when the refused request declared a body of at most
``keep_alive_body`` bytes (uvicorn drops the body's bytes as they arrive, unbuffered, and the next request
on the connection is parsed after them): closing it made every refusal cost a TCP teardown, a new
connection and a new protocol object, on both sides, which was most of the cost of refusing at 2-3x
capacity. A refused request with a larger, chunked or undeclared body closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger(__name__)

_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: 68\r\n"
        b"connection: close\r\n\r\n"
        b'{"detail": "the request headers were not complete within the limit"}')


def _is_report(method: str, path: str) -> bool:
    return method == "POST" and (path == "/v1/events" or (path.startswith("/v1/nodes/")
                                                          and path.endswith("/heartbeat")))


_BUSY = b'{"detail": "controller busy: too many reports in flight; retry later"}'
_BUSY_HEAD = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
              b"content-length: %d\r\n" % len(_BUSY))


def _busy(default_headers: Iterable[tuple[bytes, bytes]], close: bool) -> bytes:
    """The whole 429 response: uvicorn's default headers (date, server), ours, the body."""
    extra = b"".join(k + b": " + v + b"\r\n" for k, v in default_headers)
    return _BUSY_HEAD + extra + (b"connection: close\r\n\r\n" if close else b"\r\n") + _BUSY


def _declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's Content-Length, or None when absent, repeated or not a number."""
    found = [v for k, v in headers if k == b"content-length"]
    if len(found) != 1 or not found[0].isdigit():
        return None
    return int(found[0])


def admission_protocol(timeout_s: float, refused: Counter[str], max_inflight: int | None = None,
                       keep_alive_body: int = 1 << 20) -> type[asyncio.Protocol]:
    """Uvicorn's httptools protocol with a ``timeout_s`` deadline on each request's headers and, with
    ``max_inflight``, agents' reports refused (429) while more requests than that are in flight (the
    connection kept when the refused body is declared and at most ``keep_alive_body`` bytes)."""
    if timeout_s <= 0:
        raise ValueError(f"header timeout: {timeout_s!r} is not a duration > 0")
    if max_inflight is not None and max_inflight < 1:
        raise ValueError(f"max in flight: {max_inflight!r} is not a count >= 1")

    class Admission(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
            scope = cycle.scope
            if (max_inflight is not None and len(self.tasks) >= max_inflight
                    and _is_report(scope["method"], scope["path"])):
                self._refuse(cycle)
                return
            super()._start_asgi_task(cycle, app)

        def _refuse(self, cycle: RequestResponseCycle) -> None:
            """Answer 429 right here — no task, no ASGI app: what uvicorn's cycle does when an app's
            last body message is sent, with the response written in one piece."""
            refused["inflight"] += 1
            length = _declared_length(cycle.scope["headers"])
            keep = cycle.keep_alive and length is not None and length <= keep_alive_body
            self.transport.write(_busy(self.server_state.default_headers, close=not keep))
            cycle.response_complete = True  # from here uvicorn drops the request's body as it arrives
            cycle.message_event.set()
            if not keep:
                self.transport.close()
            cycle.on_response()

        def _expired(self) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            refused["header_timeout"] += 1
            peer: Any = self.client
            log.warning("refused a connection from %s: request headers not complete within %.0f s",
                        f"{peer[0]}:{peer[1]}" if peer else "unknown", timeout_s)
            self.transport.write(_408)
            self.transport.close()

    return Admission
