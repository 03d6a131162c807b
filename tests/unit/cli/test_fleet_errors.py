"""How ``gpufleet fleet`` (and maintenance, spares, tenancy) word the controller's 404 and 422 answers:
once, as the controller said them, with the route; not "node "/nodes/x: node 'x' not found" not found"."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gpufleet.cli.errors import EXIT_NOT_FOUND, EXIT_USAGE, exit_code_for
from gpufleet.cli.fleet import Client
from gpufleet.domain.errors import InvalidInput, NotFound


def _answer(monkeypatch: pytest.MonkeyPatch, status: int, body: Any) -> None:
    def request(method: str, url: str, **_: Any) -> httpx.Response:
        return httpx.Response(status, json=body, request=httpx.Request(method, url))

    monkeypatch.setattr(httpx, "request", request)


def test_a_404_is_said_once_with_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 404, {"detail": "node 'nope' not found"})
    with pytest.raises(NotFound) as err:
        Client("http://ctl:8470", "t").call("POST", "/nodes/nope/drain", {"reason": "x"})
    assert str(err.value) == "node 'nope' not found (POST /v1/nodes/nope/drain)"
    assert exit_code_for(err.value) == EXIT_NOT_FOUND


def test_a_422_names_the_field_the_controller_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 422, {"detail": [{"field": "state", "value": "bogus", "expected": "one of new, ready"}]})
    with pytest.raises(InvalidInput) as err:
        Client("http://ctl:8470", "t").call("GET", "/nodes", state="bogus")
    assert (err.value.field, err.value.value, err.value.expected) == ("state", "bogus", "one of new, ready")
    assert exit_code_for(err.value) == EXIT_USAGE


def test_a_422_without_fields_still_names_the_route(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 422, {"detail": "no"})
    with pytest.raises(InvalidInput) as err:
        Client("http://ctl:8470", "t").call("GET", "/nodes")
    assert (err.value.field, err.value.value) == ("request", "/nodes")
