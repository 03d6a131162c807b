"""A 422 from a real ``controller serve`` names every value it would have accepted (a drill: the list of
event kinds was cut after 200 characters, in the middle of ``'moved'``, so an operator could not tell
whether ``gpu_idle`` was a kind)."""

from __future__ import annotations

from pathlib import Path

import httpx

from gpufleet.domain.events import EventKind
from tests.integration.serve.serving import HEADERS, serving


def test_a_wrong_event_kind_is_answered_with_every_kind_there_is(tmp_path: Path) -> None:
    with serving(tmp_path, f"sqlite:///{tmp_path / 'g.db'}") as base:
        event = {"id": "e1", "node": "sim-n001", "kind": "gpu_fell_off", "time": "2026-11-21T12:00:00Z"}
        r = httpx.post(f"{base}/events", json={"events": [event]}, headers=HEADERS, timeout=10)
    assert r.status_code == 422, r.text
    [d] = r.json()["detail"]
    assert (d["field"], d["value"]) == ("events[0].kind", "gpu_fell_off")
    missing = [k.value for k in EventKind if f"'{k.value}'" not in d["expected"]]
    assert not missing, f"422 names {d['expected']!r}, without {missing}"
    assert not d["expected"].endswith("...")


def test_an_allowed_values_list_too_long_to_show_is_cut_and_says_where_the_rest_is() -> None:
    import json

    from gpufleet.controller.api.errors import EXPECTED_CUT, MAX_EXPECTED, response_for
    from gpufleet.domain.errors import InvalidInput

    values = [f"value{i:05d}" for i in range(MAX_EXPECTED)]
    [d] = json.loads(bytes(response_for(InvalidInput("kind", "x", f"one of {values}")).body))["detail"]
    assert d["expected"].startswith("one of ['value00000', ") and d["expected"].endswith(EXPECTED_CUT)
    assert len(d["expected"]) <= MAX_EXPECTED + len("..." + EXPECTED_CUT)
