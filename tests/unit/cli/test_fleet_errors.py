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


def test_no_token_says_neither_way_was_given_and_an_empty_file_is_named(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_TOKEN"}
    cmd = [sys.executable, "-m", "gpufleet.cli", "fleet", "--url", "http://127.0.0.1:9"]
    res = subprocess.run([*cmd, "status"], check=False, capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == EXIT_USAGE
    assert "GPUFLEET_TOKEN: got None" in res.stderr and "neither was given" in res.stderr, res.stderr
    empty = tmp_path / "token"
    empty.write_text("\n", encoding="utf-8")
    res = subprocess.run([*cmd, "--token-file", str(empty), "status"], check=False, capture_output=True, text=True,
                         env=env, timeout=60)
    assert res.returncode == EXIT_USAGE and f"--token-file: got '{empty}'" in res.stderr and "empty" in res.stderr
