"""Schemathesis against the real app, on SQLite and on the real PostgreSQL: no request gets a 5xx, every
422 names the field, the value and what was expected, every other 4xx says why, and a 404 names what it
did not find and its value.

Bounded and repeatable: a fixed number of generated requests per operation (valid and invalid ones),
derandomised and generated once for both databases, so a CI run is the same run every time (issue #16:
13,000 such requests found the 500s and the SQL in a 503 body that the regression tests in
test_hardening.py pin down).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.integration.api.conftest import BACKENDS, Api, api_on, auth

CASES_PER_OPERATION = 50  # x 2 modes x 28 operations: about 2,800 requests per database


@pytest.fixture(params=BACKENDS)
def fuzzed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    with api_on(request.param, tmp_path) as api:
        yield api


def problems(status: int, body: bytes, what: str) -> list[str]:
    """What is wrong with one answer (empty: nothing)."""
    if status >= 500:
        return [f"{what}: {status} {body[:300]!r}"]
    if 400 <= status < 500 and status != 422:
        return _named(status, body, what)
    if status != 422:
        return []
    try:
        details = json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        return [f"{what}: 422 whose body is not {{'detail': [...]}}: {body[:300]!r}"]
    bad = [d for d in details if not (isinstance(d, dict) and set(d) == {"field", "value", "expected"}
                                      and d["field"] and d["expected"])]
    return [f"{what}: 422 entry without field/value/expected: {bad[:2]}"] if bad or not details else []


def _named(status: int, body: bytes, what: str) -> list[str]:
    """A 4xx other than 422 says what was wrong in ``detail``; a 404 names what it did not find and its
    value (``node 'r09-n09' not found``)."""
    try:
        detail = json.loads(body)["detail"]
    except (ValueError, KeyError, TypeError):
        return [f"{what}: {status} whose body is not {{'detail': ...}}: {body[:300]!r}"]
    if not isinstance(detail, str) or not detail.strip():
        return [f"{what}: {status} without a message: {body[:300]!r}"]
    if status == 404 and not re.fullmatch(r"""\S.* (['"]).*\1 not found""", detail, re.DOTALL):
        return [f"{what}: 404 that does not name what and which: {detail[:300]!r}"]
    return []


# (operation, mode) -> the requests generated for it. The cases depend only on the schema (derandomised, and
# nothing from an answer feeds back into generation: a problem is noted, not raised, so nothing shrinks),
# so every backend is sent the same requests, generated once: generating was about half of each run.
_GENERATED: dict[tuple[str, str], list[dict[str, Any]]] = {}


def _requests(op: Any, mode: GenerationMode) -> list[dict[str, Any]]:
    """``CASES_PER_OPERATION`` generated requests for ``op`` in ``mode``, as keyword arguments of
    ``httpx.Client.request``."""
    key = (op.label, mode.value)
    if key in _GENERATED:
        return _GENERATED[key]
    out: list[dict[str, Any]] = []
    headers = auth("admin")

    @settings(max_examples=CASES_PER_OPERATION, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def generate(case: Any) -> None:
        kwargs = case.as_transport_kwargs(headers=headers)
        sent = {k: v for k, v in kwargs.items() if v and k in ("headers", "params", "content", "json", "data")}
        out.append({"method": kwargs["method"], "url": kwargs["url"].replace("http://localhost", ""), **sent})

    generate()
    _GENERATED[key] = out
    return out


def _check(api: Api, op: Any, mode: GenerationMode, found: list[str]) -> None:
    """Send the generated requests for ``op`` in ``mode``; note what is wrong."""
    what = f"{op.label} [{mode.value}]"
    requests = _requests(op, mode)
    assert requests, f"{what}: no request generated"
    for req in requests:
        r = api.client.request(**req)
        found.extend(problems(r.status_code, r.content, what))


def test_no_generated_request_gets_a_server_error_and_every_422_names_its_field(fuzzed: Api) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed.app)
    found: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _check(fuzzed, result.ok(), mode, found)
    assert operations >= 28
    assert found == []
