"""The forwarding client (controller.api.leaderclient) against a real local socket server."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.controller.api.leaderclient import LeaderClient, LeaderUnreachable

pytestmark = pytest.mark.ha


async def serve(answers: list[bytes], *, close_after: int = 0
                ) -> tuple[asyncio.Server, str, list[bytes], asyncio.Event]:
    """A server answering each request with the next of ``answers``; it closes a connection after
    ``close_after`` requests (0: never) and then sets the event it returns."""
    seen: list[bytes] = []
    closed = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                           if h.lower().startswith(b"content-length")), 0)
            seen.append(head + await reader.readexactly(length))
            writer.write(answers.pop(0))
            await writer.drain()
            served += 1
            if close_after and served >= close_after:
                break
        writer.close()
        await writer.wait_closed()
        closed.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", seen, closed


def test_content_length_chunked_and_keep_alive() -> None:
    async def go() -> None:
        server, url, seen, _closed = await serve([
            b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        ])
        client = LeaderClient(5)
        a = await client.request(url, "POST", "/v1/events?x=1", [(b"authorization", b"Bearer t")], b"{}")
        assert (a.status, a.body, dict(a.headers)[b"content-type"]) == (202, b'{"ok":true}', b"application/json")
        b = await client.request(url, "GET", "/v1/mode", [], b"")
        assert (b.status, b.body) == (200, b"abcde")
        assert seen[0].startswith(b"POST /v1/events?x=1 HTTP/1.1\r\n") and seen[0].endswith(b"\r\n\r\n{}")
        assert b"authorization: Bearer t" in seen[0]
        assert len(client._idle[url]) == 1, "both requests went over one kept-alive connection"
        await client.close()
        server.close()

    asyncio.run(go())


def test_a_connection_the_leader_closed_is_replaced_and_the_request_sent_once() -> None:
    async def go() -> None:
        ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        server, url, seen, closed = await serve([ok, ok], close_after=1)
        client = LeaderClient(5)
        assert (await client.request(url, "PUT", "/a", [], b"1")).body == b"ok"
        await closed.wait()  # the server closed its end of the kept connection
        assert (await client.request(url, "PUT", "/b", [], b"2")).body == b"ok"
        assert [s.split(b" ")[1] for s in seen] == [b"/a", b"/b"]
        await client.close()
        server.close()

    asyncio.run(go())


def test_no_leader_listening_is_unreachable() -> None:
    async def go() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(LeaderUnreachable):
            await LeaderClient(2).request(f"http://127.0.0.1:{port}", "GET", "/", [], b"")

    asyncio.run(go())
