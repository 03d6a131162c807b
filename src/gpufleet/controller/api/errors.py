"""How errors become HTTP responses (the one place that decides it).

422: the body or a parameter is invalid — ``{"detail": [{"field", "value", "expected"}]}``;
404: unknown node/action; 409: not allowed in the current state; 503: an external system failed.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gpufleet.domain.errors import Conflict, ExternalError, GpufleetError, InvalidInput, NotFound


def _field(loc: tuple[Any, ...]) -> str:
    parts = [p for p in loc if p not in ("body", "query", "path")]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def _value(v: Any) -> Any:
    if isinstance(v, str):  # a lone surrogate cannot be encoded as UTF-8: show it escaped instead
        return v.encode("utf-8", "backslashreplace").decode("utf-8") if len(v) <= 200 else _value(v[:200] + "...")
    if isinstance(v, int | float | bool) or v is None:
        return v
    text = repr(v)
    return text if len(text) <= 200 else text[:200] + "..."


def _entry(e: Any) -> dict[str, Any]:
    if e.get("type") == "json_invalid":  # loc is ("body", <character offset>): not a field
        at = e["loc"][-1] if isinstance(e["loc"][-1], int) else None
        why = (e.get("ctx") or {}).get("error", e["msg"])
        return {"field": "body", "value": None,
                "expected": f"a JSON document ({why}" + (f" at character {at})" if at is not None else ")")}
    return {"field": _field(tuple(e["loc"])), "value": _value(e.get("input")), "expected": e["msg"]}


def _authenticated(req: Request) -> bool:
    scheme, _, token = req.headers.get("authorization", "").partition(" ")
    registry = getattr(req.app.state, "tokens", None)
    if scheme.lower() != "bearer" or not token or registry is None:
        return False
    return registry.caller(token.strip()) is not None


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid_body(req: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        # FastAPI decodes the JSON before it runs the auth dependency; a caller without a valid token
        # learns nothing about the body, so it gets the 401 it would have got with a well-formed one.
        if any(e.get("type") == "json_invalid" for e in errors) and not _authenticated(req):
            return JSONResponse({"detail": "missing or invalid bearer token (Authorization: Bearer <token>)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return JSONResponse({"detail": [_entry(e) for e in errors]}, status_code=422)

    @app.exception_handler(GpufleetError)
    async def _domain(_req: Request, err: GpufleetError) -> JSONResponse:
        return response_for(err)


def response_for(err: GpufleetError) -> JSONResponse:
    """The answer to a domain error (also used by the ingest fast path, so both answer alike)."""
    if isinstance(err, InvalidInput):
        return JSONResponse({"detail": [{"field": err.field, "value": _value(err.value), "expected": err.expected}]},
                            status_code=422)
    if isinstance(err, NotFound):
        return JSONResponse({"detail": str(err)}, status_code=404)
    if isinstance(err, Conflict):
        return JSONResponse({"detail": str(err)}, status_code=409)
    if isinstance(err, ExternalError):
        return JSONResponse({"detail": str(err)}, status_code=503)
    return JSONResponse({"detail": str(err)}, status_code=500)
