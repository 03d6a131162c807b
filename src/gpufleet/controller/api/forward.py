"""On a follower replica: what needs the leader goes to the leader (docs/decisions/0100).

The leader alone holds the lifecycle engine's state in memory and decides; every replica reads the
database. So a follower answers reads of the database itself and forwards to the leader:

* every write (any method but GET/HEAD/OPTIONS): event and heartbeat reports, inventories, operator
  actions, checkpoints, maintenance, registrations — the caller's answer is the leader's answer, so a
  2xx still means "durable on the leader, at its epoch";
* the reads of the leader's memory (:data:`LEADER_READS`: breaker, dry-run, correlation verdicts, the
  status summary, the hot-spare pools (the spares runner's plan), the firmware inventory (the BMC
  watcher's), the tenants and their nodes, the web UI; a node's repair commands and bundles, which
  check the node in memory);
* every ``/v1`` read by a tenant-scoped token: what such a token sees is decided by who owns each
  registered node (api/scope.py), which the leader keeps current and a follower knows only as it was
  when it started.

A ``/v1`` request is authenticated here first, by the code the routes use (``auth.authenticate``): one
without a valid bearer token is answered 401 by the follower, counted as ``unauthenticated`` among
its refused requests, and never reaches the leader. The leader authorises the caller (role, nodes,
tenant) as if it had come directly. The web UI's requests (``/``, ``/ui/``) go on unchecked: they sign
in with a session cookie (web/session.py), and the sign-in page itself must reach the leader.

A forwarded request carries :data:`FORWARDED` and is never forwarded again: a replica that receives one
and does not lead answers 503 (the caller retries, as agents do). With no leader known, or the leader
unreachable, the answer is 503 with ``Retry-After`` — never a guess. When the TLS handshake with the
leader fails (the leader refuses this replica's client certificate, ``[ha] forward_certfile``, or this
replica does not trust the leader's, ``[ha] forward_ca``) the answer is 502 naming the setting: waiting
does not fix a certificate (docs/decisions/0101).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..ha.elector import Leadership
from .auth import Refusal, TokenRegistry, authenticate, note_refused
from .leaderclient import LeaderClient, LeaderTlsRefused, LeaderUnreachable

log = logging.getLogger(__name__)
FORWARDED = "x-gpufleet-forwarded-by"
LEADER_READS = frozenset({"/v1/status", "/v1/breaker", "/v1/mode", "/v1/verdicts", "/v1/spares", "/v1/firmware",
                          "/v1/tenancy", "/"})
# a tenant-scoped token's reads go to the leader (who owns which node), except this replica's own health
_OWN_READS = frozenset({"/v1/health", "/v1/ready"})
# GET /v1/nodes/{node}/commands and /bundles check the node against the engine's memory (404 for one it
# does not know): a follower started before the node was registered would not know it
_LEADER_NODE_READS = ("/commands", "/bundles")
_READS = frozenset({"GET", "HEAD", "OPTIONS"})
_HOP = frozenset({b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"upgrade",
                  b"te", b"trailer", b"proxy-authorization", b"proxy-connection"})
RETRY_AFTER_S = 1


def needs_leader(method: str, path: str) -> bool:
    if method not in _READS:
        return True
    if path.startswith("/v1/nodes/") and path.endswith(_LEADER_NODE_READS):
        return True
    return path in LEADER_READS or (path.startswith("/ui/") and not path.startswith("/ui/static/"))


@dataclass(frozen=True, slots=True)
class ForwardTls:
    """How a follower checks the leader's certificate (``[ha] forward_ca`` / ``forward_tls_name``) and the
    client certificate it presents (``[ha] forward_certfile`` / ``forward_keyfile``, or ``[tls]``'s)."""

    ca: Path | None = None  # the CA the leader's certificate chains to (None: the system store)
    name: str = ""  # the name the certificate was issued for, when the advertise URL is an address
    certfile: Path | None = None  # the client certificate presented to the leader (None: none)
    keyfile: Path | None = None
    cert_setting: str = "ha.forward_certfile"  # where certfile came from, for error messages


class ForwardToLeader:
    def __init__(self, app: ASGIApp, leadership: Leadership, tokens: TokenRegistry, timeout_s: float = 30.0,
                 tls: ForwardTls | None = None, counts: Counter[str] | None = None,
                 refused: Counter[str] | None = None) -> None:
        """``tokens``: the API's (a /v1 request is authenticated before it is forwarded); ``refused``: the
        API's count of refused requests, by reason."""
        self.app, self.leadership, self.tokens, self.refused = app, leadership, tokens, refused
        self.timeout_s = timeout_s
        self.tls = tls or ForwardTls()
        t = self.tls
        cert = (str(t.certfile), str(t.keyfile)) if t.certfile is not None and t.keyfile is not None else None
        self.client = LeaderClient(timeout_s, ca=str(t.ca) if t.ca else None, tls_name=t.name, cert=cert)
        # requests this replica passed on, by outcome (gpufleet_forwarded_requests_total): forwarded (the
        # leader answered), tls_refused (502), leader_unreachable, no_leader, leader_changing (503)
        self.counts: Counter[str] = counts if counts is not None else Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.leadership.leading():
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        forward = needs_leader(method, path)
        if path.startswith("/v1/"):
            caller = authenticate(self.tokens, _header(scope, b"authorization"))
            if isinstance(caller, Refusal):
                if forward:  # the leader would refuse it: refuse it here, at no cost to the leader
                    client = scope.get("client")
                    note_refused(self.refused, method, path, client[0] if client else "?", "unauthenticated",
                                 caller.why)
                    await _error(send, 401, caller.detail, [(b"www-authenticate", b"Bearer")])
                    return
            elif caller.tenant is not None and path not in _OWN_READS:
                forward = True
        if not forward:
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        if any(k.lower() == FORWARDED.encode() for k, _ in headers):
            self.counts["leader_changing"] += 1
            await _unavailable(send, f"replica {self.leadership.replica} is not the leader either "
                                     "(leadership is changing); retry")
            return
        url = self.leadership.leader_url
        if not url:
            self.counts["no_leader"] += 1
            await _unavailable(send, "no leader elected yet; retry")
            return
        body = await _body(receive)
        raw = scope.get("raw_path") or scope["path"].encode()  # as the caller encoded it
        target = raw.decode("latin-1")
        query = scope.get("query_string", b"")
        if query:
            target += "?" + query.decode("latin-1")
        headers.append((FORWARDED.encode(), self.leadership.replica.encode()))
        try:
            answer = await self.client.request(url, scope["method"], target, headers, body)
        except LeaderTlsRefused as err:
            self.counts["tls_refused"] += 1
            t = self.tls
            detail = (f"TLS with the leader at {url} failed: {err}; check this replica's {t.cert_setting} (the "
                      "client certificate it presents, which the leader's [tls] client_ca must have signed) and "
                      "ha.forward_ca (the CA it checks the leader's certificate against)")
            # the files in the log only: the answer goes to a caller not yet authenticated
            log.error("forwarding %s %s: %s; %s = %s, ha.forward_ca = %s", scope["method"], scope["path"], detail,
                      t.cert_setting, t.certfile or "none", t.ca or "the system store")
            await _error(send, 502, detail)
            return
        except LeaderUnreachable as err:
            self.counts["leader_unreachable"] += 1
            log.warning("forwarding %s %s to the leader at %s failed: %s", scope["method"], scope["path"], url, err)
            await _unavailable(send, f"the leader at {url} did not answer; retry")
            return
        self.counts["forwarded"] += 1
        out = [(k, v) for k, v in answer.headers if k not in _HOP]
        out.append((b"content-length", str(len(answer.body)).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        await send({"type": "http.response.body", "body": answer.body})


def _header(scope: Scope, name: bytes) -> str:
    """The first ``name`` header (as Starlette reads it), or ''."""
    for k, v in scope["headers"]:
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return ""


async def _body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _unavailable(send: Send, detail: str) -> None:
    await _error(send, 503, detail, [(b"retry-after", str(RETRY_AFTER_S).encode())])


async def _error(send: Send, status: int, detail: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *(extra or []),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
