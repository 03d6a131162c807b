"""How a browser presents a token to the web UI, and how the UI's forms are protected (decision 0061).

A person signs in once on ``/ui/login`` with the same bearer token the API takes. The token goes into
a cookie the browser sends back on the UI's routes only — ``HttpOnly`` (no script can read it),
``SameSite=Strict`` (another site cannot make the browser send it), ``Secure`` when the controller
serves TLS — and every request checks it against the token registry again, so removing a token from
``controller.toml`` ends its sessions at the next restart.

Every form that changes something carries a CSRF token derived from the session's token
(``HMAC-SHA256(token, "gpufleet-ui-csrf/v1")``: no server-side state, the same after a restart, and
worthless without the token). A POST authenticated by the cookie must carry it, and, where the browser
says where the request came from (``Origin``, ``Sec-Fetch-Site``), must come from the UI's own origin.
A request with an ``Authorization: Bearer`` header instead (a script, a test) needs neither: a browser
never adds that header on its own.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from fastapi import Request
from starlette.responses import Response

from gpufleet.controller.api.auth import OPERATE, READ, Caller, TokenRegistry

COOKIE = "gpufleet_session"
SESSION_LENGTH = timedelta(hours=12)  # the browser forgets the cookie after this; sign in again
CSRF_FIELD = "csrf"
_CSRF_CONTEXT = b"gpufleet-ui-csrf/v1"


@dataclass(frozen=True, slots=True)
class Session:
    """Who is looking at the UI, and how they presented their token."""

    caller: Caller
    token: str
    by_cookie: bool

    @property
    def may_operate(self) -> bool:
        return self.caller.role in OPERATE

    @property
    def actor_id(self) -> str:
        return f"{self.caller.role}:{self.caller.name}"  # as the API records an operator

    @property
    def csrf(self) -> str:
        return csrf_token(self.token)


def csrf_token(token: str) -> str:
    return hmac.new(token.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def session_of(request: Request) -> Session | None:
    """The caller behind ``request``: its bearer header if it sends one, else the session cookie. None
    when neither holds a valid token of a role that may read (agents' tokens do not open the UI), or the
    token is tenant-scoped (the UI shows the whole fleet: a tenant uses the API, docs/tenancy.md)."""
    scheme, _, header = request.headers.get("authorization", "").partition(" ")
    by_cookie = not header
    token = (request.cookies.get(COOKIE, "") if by_cookie else header if scheme.lower() == "bearer" else "").strip()
    if not token:
        return None
    registry: TokenRegistry = request.app.state.tokens
    caller = registry.caller(token)
    if caller is None or caller.role not in READ or caller.tenant is not None:
        return None
    return Session(caller, token, by_cookie)


def sign_in(response: Response, request: Request, token: str) -> None:
    response.set_cookie(COOKIE, token, max_age=int(SESSION_LENGTH.total_seconds()), path="/", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")


def sign_out(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


def forged(session: Session, request: Request, form: Mapping[str, str]) -> str | None:
    """Why a state-changing request must be refused as a possible cross-site forgery, or None."""
    if not session.by_cookie:
        return None
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"the request came from another site (Sec-Fetch-Site: {fetch_site})"
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin is not None and origin != own:
        return f"the request came from {origin}, not {own}"
    if not hmac.compare_digest(form.get(CSRF_FIELD, ""), session.csrf):
        return "the form's CSRF token is missing or wrong (reload the page and try again)"
    return None


def safe_next(path: str) -> str:
    """Where to go after signing in: a path on this server only (no open redirect)."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path
