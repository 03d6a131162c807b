"""Bearer-token authentication and role checks (every /v1 route goes through ``require``)."""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fastapi import HTTPException, Request, status

from gpufleet.controller.settings import Role, TokenConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    role: Role
    nodes: tuple[str, ...]
    tenant: str | None = None  # a tenant-scoped token: its tenant's nodes only (api/scope.py)

    def may_report_for(self, node: str) -> bool:
        if self.role != Role.AGENT:
            return True
        return any(fnmatch.fnmatchcase(node, pat) for pat in self.nodes)


READ = (Role.VIEWER, Role.OPERATOR, Role.ADMIN)
REPORT = (Role.AGENT, Role.OPERATOR, Role.ADMIN)
OPERATE = (Role.OPERATOR, Role.ADMIN)
ADMINISTER = (Role.ADMIN,)


class TokenRegistry:
    def __init__(self, tokens: Sequence[TokenConfig]) -> None:
        self._tokens = [(t.digest, Caller(t.name, t.role, t.nodes, t.tenant)) for t in tokens]

    def caller(self, token: str) -> Caller | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        found = None
        for known, caller in self._tokens:  # compare with every entry: no early exit timing signal
            if hmac.compare_digest(known, digest):
                found = caller
        return found


MISSING_TOKEN = "missing bearer token (Authorization: Bearer <token>)"
INVALID_TOKEN = "invalid token"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request has no caller: ``detail`` is the 401's, ``why`` the log's."""

    detail: str
    why: str


def authenticate(registry: TokenRegistry, authorization: str) -> Caller | Refusal:
    """The caller behind an ``Authorization`` header's value, or why there is none. The one check of a
    bearer token: the routes (:func:`require`), the ingest fast path and a follower replica before it
    forwards (forward.py) all call it."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return Refusal(MISSING_TOKEN, "no bearer token")
    caller = registry.caller(token.strip())
    return caller if caller is not None else Refusal(INVALID_TOKEN, "unknown token")


def note_refused(counts: Counter[str] | None, method: str, path: str, peer: str, reason: str, detail: str) -> None:
    """Log and count a request refused for its credentials (the counts are in ``/v1/status``)."""
    if counts is not None:
        counts[reason] += 1
    log.warning("refused %s %s from %s: %s (%s)", method, path[:200], peer, reason, detail)


def refused(request: Request, reason: str, detail: str) -> None:
    note_refused(getattr(request.app.state, "refused", None), request.method, request.url.path,
                 request.client.host if request.client else "?", reason, detail)


def require(roles: Sequence[Role]) -> Callable[[Request], Awaitable[Caller]]:
    """A FastAPI dependency: the caller, if its bearer token is valid and its role is one of ``roles``.

    It is a coroutine on purpose: a plain function dependency would cost every request a hop to the
    thread pool, and checking a token never blocks."""

    async def dep(request: Request) -> Caller:
        caller = authenticate(request.app.state.tokens, request.headers.get("authorization", ""))
        if isinstance(caller, Refusal):
            refused(request, "unauthenticated", caller.why)
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, caller.detail, headers={"WWW-Authenticate": "Bearer"})
        if caller.role not in roles:
            refused(request, "forbidden", f"token {caller.name!r} has role {caller.role}")
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                f"role {caller.role} may not do this (needs one of {', '.join(roles)})")
        return caller

    return dep
