"""A deadline for a request's headers: a connection that does not finish them in time is closed.

Uvicorn bounds an idle keep-alive connection, and :mod:`limits` bounds the body once the app is called,
but nothing bounds the time *before* the app is called: a client that opens a connection and sends half
a request line (or one header byte a minute) holds a socket and a protocol object for ever. A thousand
such clients held a test controller's sockets for as long as they liked (issue #16). This protocol —
uvicorn's own httptools protocol with one timer added — starts a clock when a connection opens and when
each request on it begins, stops it when the request's headers are complete, and closes the connection
with a 408 when it runs out. Each such close is logged with the peer address and counted as
``header_timeout`` among the refused requests (``/v1/status``, ``gpufleet_api_refused_total``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: 68\r\n"
        b"connection: close\r\n\r\n"
        b'{"detail": "the request headers were not complete within the limit"}')


def header_deadline_protocol(timeout_s: float, refused: Counter[str]) -> type[asyncio.Protocol]:
    """Uvicorn's httptools protocol with a ``timeout_s`` deadline on each request's headers."""
    if timeout_s <= 0:
        raise ValueError(f"header timeout: {timeout_s!r} is not a duration > 0")

    class HeaderDeadline(HttpToolsProtocol):
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

    return HeaderDeadline
