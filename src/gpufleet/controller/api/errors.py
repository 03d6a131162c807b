"""How errors become HTTP responses (the one place that decides it).

422: the body or a parameter is invalid — ``{"detail": [{"field", "value", "expected"}]}``;
404: unknown node/action; 409: not allowed in the current state, or an idempotency key reused for
another payload; 429: the ingest queue is full (``Retry-After``); 503: an external system failed.
Nothing here may raise: every value shown is made JSON-safe and bounded first (:func:`shown`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError

from gpufleet.controller.failurelog import FailureLog
from gpufleet.controller.store.db import brief
from gpufleet.domain.errors import (
    Conflict,
    ExternalError,
    GpufleetError,
    InvalidInput,
    NotFound,
    Overloaded,
    validation_expected,
)

from .auth import Caller, authenticate

log = logging.getLogger(__name__)


MAX_SHOWN = 200  # characters of a field name or a value an error body repeats (the caller's: any size)
# characters of what was expected: the controller's own words (a schema's allowed values, a rule), so a
# list of allowed values is shown whole; only a list longer than this is cut, and then says where the rest is
MAX_EXPECTED = 2000
EXPECTED_CUT = " (cut; GET /openapi.json names every allowed value)"


def _cut(text: str, limit: int = MAX_SHOWN, more: str = "...") -> str:
    """At most ``limit`` characters (then ``more``), and only characters JSON can carry as UTF-8 (a lone
    surrogate is shown escaped)."""
    if len(text) > limit:
        text = text[:limit] + more
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _expected(text: str) -> str:
    """What was expected, as an error body says it: every allowed value a schema lists (event kinds,
    states), bounded by MAX_EXPECTED."""
    return _cut(text, MAX_EXPECTED, "..." + EXPECTED_CUT)


def shown(v: Any) -> Any:
    """``v`` as an error body shows it: a JSON value of bounded size. Never raises (it runs while an
    error is being answered; a failure here would turn a 422 into a 500)."""
    try:
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):  # a huge integer has no decimal form (int_max_str_digits) and no JSON number
            return v if v.bit_length() <= 64 else f"an integer of {v.bit_length()} bits"
        if isinstance(v, float):  # NaN and infinities are not JSON
            return v if math.isfinite(v) else repr(v)
        return _cut(v if isinstance(v, str) else repr(v))
    except Exception:  # a value whose repr fails, or nests too deep to print
        return f"<a value of type {type(v).__name__}>"


def _field(loc: tuple[Any, ...]) -> str:
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return _cut(out) or "body"


def _entry(e: Any) -> dict[str, Any]:
    if e.get("type") == "json_invalid":  # loc is ("body", <character offset>): not a field
        at = e["loc"][-1] if isinstance(e["loc"][-1], int) else None
        why = (e.get("ctx") or {}).get("error", e["msg"])
        return {"field": "body", "value": None,
                "expected": _expected(f"a JSON document ({why}" + (f" at character {at})" if at is not None else ")"))}
    return {"field": _field(tuple(e["loc"])), "value": shown(e.get("input")),
            "expected": _expected(validation_expected(str(e["msg"])))}


def invalid(details: list[dict[str, Any]]) -> JSONResponse:
    """The 422 answer: ``{"detail": [{"field", "value", "expected"}, ...]}``."""
    try:
        return JSONResponse({"detail": details}, status_code=422)
    except Exception:  # cannot happen with shown() values; if it ever does, still answer 422
        log.exception("could not encode a 422 body")
        return JSONResponse({"detail": [{"field": "body", "value": None, "expected": "a valid request"}]},
                            status_code=422)


def _authenticated(req: Request) -> bool:
    registry = getattr(req.app.state, "tokens", None)
    return registry is not None and isinstance(authenticate(registry, req.headers.get("authorization", "")), Caller)


def _safe_entry(e: Any) -> dict[str, Any]:
    try:
        return _entry(e)
    except Exception:
        return {"field": "body", "value": None, "expected": "a valid request"}


def install(app: FastAPI) -> None:
    # every request fails alike while the database is away: one line, then a count (no success is heard
    # here: a minute without a failure ends the episode)
    db_failures = FailureLog(log, "answering a request from the database")

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(req: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        # FastAPI decodes the JSON before it runs the auth dependency; a caller without a valid token
        # learns nothing about the body, so it gets the 401 it would have got with a well-formed one.
        if any(e.get("type") == "json_invalid" for e in errors) and not _authenticated(req):
            return JSONResponse({"detail": "missing or invalid bearer token (Authorization: Bearer <token>)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return invalid([_safe_entry(e) for e in errors])

    @app.exception_handler(GpufleetError)
    async def _domain(_req: Request, err: GpufleetError) -> JSONResponse:
        return response_for(err)

    @app.exception_handler(SQLAlchemyError)
    async def _db(_req: Request, err: SQLAlchemyError) -> JSONResponse:
        # A read the validation let through and the database refused, or the database is down.
        db_failures.failed(err, trace=False)
        return JSONResponse({"detail": _cut(f"database: {brief(err)}")}, status_code=503)


def response_for(err: GpufleetError) -> JSONResponse:
    """The answer to a domain error (also used by the ingest fast path, so both answer alike)."""
    if isinstance(err, InvalidInput):
        return invalid([{"field": _cut(str(err.field)), "value": shown(err.value),
                        "expected": _expected(err.expected)}])
    if isinstance(err, NotFound):
        return JSONResponse({"detail": f"{err.what} {shown(err.ident)!r} not found"}, status_code=404)
    if isinstance(err, Conflict):
        return JSONResponse({"detail": _cut(str(err))}, status_code=409)
    if isinstance(err, Overloaded):
        return JSONResponse({"detail": str(err)}, status_code=429,
                            headers={"Retry-After": str(max(1, math.ceil(err.retry_after_s)))})
    if isinstance(err, ExternalError):
        return JSONResponse({"detail": str(err)}, status_code=503)
    return JSONResponse({"detail": str(err)}, status_code=500)
