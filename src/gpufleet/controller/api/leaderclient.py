"""A lean keep-alive HTTP/1.1 client for forwarding to the leader (``forward.py``).

httpx cost about 1.7 ms of a follower's CPU per forwarded report (bench_replicas), more than the leader
spent deciding it. Forwarding needs one thing: send a request to one peer and read its answer, over a
few reused connections. This client writes the request bytes and reads the status line, the headers
and a Content-Length or chunked body — nothing else (no redirects, no cookies, no decompression).

A reused connection the leader had already closed fails before any byte of an answer arrives: such a
request is sent once more on a new connection (the leader never read it). Any other failure is raised
and the connection dropped.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

Headers = list[tuple[bytes, bytes]]
MAX_IDLE = 64  # idle connections kept per leader URL
MAX_HEAD = 64 * 1024


class LeaderUnreachable(Exception):
    """No answer from the leader (connect, send or read failed, or it timed out)."""


class LeaderTlsRefused(LeaderUnreachable):
    """The TLS handshake with the leader failed: one side refused the other's certificate (a setting to fix,
    not a moment to wait out)."""


@dataclass(slots=True)
class Answer:
    status: int
    headers: Headers
    body: bytes


class _Stale(Exception):
    """A reused connection was closed by the peer before it answered."""


class LeaderClient:
    def __init__(self, timeout_s: float, *, ca: str | None = None, tls_name: str = "",
                 cert: tuple[str, str] | None = None) -> None:
        """``cert``: (certificate, key) PEM files presented as a client certificate over https (the leader's
        ``[tls] client_ca`` asks for one)."""
        self.timeout_s = timeout_s
        self.tls_name = tls_name
        self._ssl = ssl.create_default_context(cafile=ca)
        self._cert = cert is not None
        if cert is not None:
            self._ssl.load_cert_chain(*cert)
            # TLS 1.2: the leader checks the certificate inside the handshake, so its refusal fails the
            # handshake here. Under TLS 1.3 it checks it after this side has finished the handshake and (its
            # asyncio TLS) closes without an alert: the refusal would look like a leader gone mid-request.
            self._ssl.maximum_version = ssl.TLSVersion.TLSv1_2
        self._idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}

    async def request(self, url: str, method: str, target: str, headers: Headers, body: bytes) -> Answer:
        try:
            return await asyncio.wait_for(self._request(url, method, target, headers, body), self.timeout_s)
        except ssl.SSLError as err:  # (before OSError, its base): a certificate refused, by either side
            raise LeaderTlsRefused(getattr(err, "verify_message", None) or err.reason or str(err)) from err
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, _Stale) as err:
            raise LeaderUnreachable(f"{type(err).__name__}: {err}") from err

    async def _request(self, url: str, method: str, target: str, headers: Headers, body: bytes) -> Answer:
        idle = self._idle.setdefault(url, [])
        while idle:
            conn = idle.pop()
            try:
                return await self._exchange(url, conn, method, target, headers, body, reused=True)
            except _Stale:
                continue
        return await self._exchange(url, await self._open(url), method, target, headers, body, reused=False)

    async def _open(self, url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        u = urlsplit(url)
        https = u.scheme == "https"
        host = u.hostname or ""
        port = u.port or (443 if https else 80)
        reader, writer = await asyncio.open_connection(host, port)
        if not https:
            return reader, writer
        try:  # the handshake apart from the connect: a failure here is about certificates, not reachability
            await writer.start_tls(self._ssl, server_hostname=self.tls_name or host)
        except ssl.SSLError as err:  # this side refused the leader's certificate (or the leader said why)
            writer.close()
            raise LeaderTlsRefused(str(getattr(err, "verify_message", None) or err.reason or err)) from err
        except (OSError, asyncio.IncompleteReadError) as err:  # the leader hung up mid-handshake
            writer.close()
            if not self._cert:
                raise
            raise LeaderTlsRefused("the leader closed the connection during the TLS handshake: it refused this "
                                   "replica's client certificate") from err
        return reader, writer

    async def _exchange(self, url: str, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], method: str,
                        target: str, headers: Headers, body: bytes, *, reused: bool) -> Answer:
        reader, writer = conn
        u = urlsplit(url)
        head = [f"{method} {target} HTTP/1.1\r\nhost: {u.netloc}\r\ncontent-length: {len(body)}\r\n".encode()]
        head += [k + b": " + v + b"\r\n" for k, v in headers]
        try:
            try:
                writer.write(b"".join(head) + b"\r\n" + body)
                await writer.drain()
                line = await reader.readline()
            except OSError:
                if reused:  # closed by the leader while idle: it read nothing of this request
                    raise _Stale() from None
                raise
            if not line:
                raise _Stale() if reused else asyncio.IncompleteReadError(b"", None)
            answer, keep = await _read_answer(line, reader, method)
        except BaseException:
            writer.close()
            raise
        if keep and len(self._idle.setdefault(url, [])) < MAX_IDLE:
            self._idle[url].append(conn)
        else:
            writer.close()
        return answer

    async def close(self) -> None:
        for conns in self._idle.values():
            for _r, w in conns:
                w.close()
        self._idle.clear()


async def _read_answer(line: bytes, reader: asyncio.StreamReader, method: str) -> tuple[Answer, bool]:
    while True:
        parts = line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {line[:80]!r}")
        status = int(parts[1])
        headers: Headers = []
        size = 0
        while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
            size += len(h)
            if size > MAX_HEAD:
                raise ValueError("the leader's answer headers are too long")
            k, _, v = h.partition(b":")
            headers.append((k.strip().lower(), v.strip()))
        if status >= 200 or status == 101:
            break
        line = await reader.readline()  # an interim 1xx answer: the real one follows
    fields = dict(headers)
    keep = fields.get(b"connection", b"").lower() != b"close" and parts[0] == b"HTTP/1.1"
    if method == "HEAD" or status in (204, 304):
        return Answer(status, headers, b""), keep
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks = []
        while (n := int((await reader.readline()).split(b";")[0].strip() or b"0", 16)) > 0:
            chunks.append(await reader.readexactly(n))
            await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return Answer(status, headers, b"".join(chunks)), keep
    if b"content-length" in fields:
        return Answer(status, headers, await reader.readexactly(int(fields[b"content-length"]))), keep
    return Answer(status, headers, await reader.read()), False  # until the leader closes


def client_certificate_refusal(certfile: str, keyfile: str, client_ca: str, server_certfile: str,
                               server_keyfile: str) -> str | None:
    """Why a server that requires client certificates signed by ``client_ca`` (as the leader's uvicorn does)
    would refuse ``certfile`` as one; None when it would accept it.

    The answer is OpenSSL's own: one TLS handshake in memory between a client presenting the certificate
    and a server configured like the leader (``server_certfile``/``server_keyfile``, ``client_ca``,
    CERT_REQUIRED). So every rule the leader applies is applied here — the chain to ``client_ca``, the
    validity dates, and the purpose: a certificate whose extendedKeyUsage lists serverAuth but not
    clientAuth is refused ("unsuitable certificate purpose"). Raises OSError / ssl.SSLError when a
    file cannot be read or a certificate does not match its key.
    """
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_certfile, server_keyfile)
    server.load_verify_locations(cafile=client_ca)
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE  # only the client's side is in question here
    client.load_cert_chain(certfile, keyfile)
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_side=False)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(16):  # a handshake is a few flights; the bound only guards against a loop
        for name, end in (("client", c), ("server", s)):
            if done[name]:
                continue
            try:
                end.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as err:
                if name == "server":
                    return str(getattr(err, "verify_message", None) or err.reason or err)
                # the client learns of the server's refusal from its alert: the server's reason came first
                return str(err.reason or err)
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done["server"]:
            return None
    return "the TLS handshake did not finish"
