from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpufleet.checks.collective import free_port
from gpufleet.checks.events import result_to_event
from gpufleet.checks.model import CheckResult, Status
from gpufleet.checks.poster import post_events, read_token
from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.domain.events import HealthEvent
from tests.unit.checks.controller_server import controller

T = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def _events(n: int) -> list[HealthEvent]:
    return [
        result_to_event(
            CheckResult("hbm_copy", g % 8, 2700.0 + g, "GB/s", 2680.0, Status.PASS),
            node=f"n{g // 8}",
            run_id="r1",
            time=T,
        )
        for g in range(n)
    ]


def test_posts_events_with_the_bearer_token() -> None:
    with controller() as ctl:
        sent = post_events(ctl.url, "s3cret", _events(3))
    assert sent == 3
    assert ctl.auth == ["Bearer s3cret"]
    (body,) = ctl.bodies
    events = body["events"]
    assert isinstance(events, list) and len(events) == 3
    assert events[0]["kind"] == "check_passed" and events[0]["source"] == "check"
    assert events[0]["attrs"]["check"] == "hbm_copy"


def test_large_runs_go_in_batches() -> None:
    with controller() as ctl:
        assert post_events(ctl.url + "/", "s3cret", _events(1100)) == 1100
    assert [len(b["events"]) for b in ctl.bodies] == [500, 500, 100]  # type: ignore[arg-type]


def test_rejection_is_an_external_error_with_the_status() -> None:
    with controller(token="other") as ctl, pytest.raises(ExternalError) as err:
        post_events(ctl.url, "s3cret", _events(1))
    assert "401" in str(err.value) and not err.value.retryable
    with controller(status=503) as ctl2, pytest.raises(ExternalError) as err2:
        post_events(ctl2.url, "s3cret", _events(1))
    assert "503" in str(err2.value) and err2.value.retryable


def test_unreachable_controller_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ExternalError) as err:
        post_events(url, "t", _events(1), timeout_s=2)
    assert "cannot reach" in str(err.value) and url in str(err.value)
    with pytest.raises(InvalidInput) as err2:
        post_events("controller:8080", "t", _events(1))
    assert err2.value.field == "--controller"


def test_token_file(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("  abc\n")
    assert read_token(f) == "abc"
    f.write_text("\n")
    with pytest.raises(InvalidInput) as err:
        read_token(f)
    assert "non-empty" in err.value.expected
    with pytest.raises(InvalidInput):
        read_token(tmp_path / "none")


def _flaky(statuses: list[int]) -> tuple[httpx.MockTransport, list[int]]:
    """A transport answering ``statuses`` in turn (then 202); records what it answered."""
    answered: list[int] = []

    def handle(_request: httpx.Request) -> httpx.Response:
        code = statuses[len(answered)] if len(answered) < len(statuses) else 202
        answered.append(code)
        return httpx.Response(code, text="busy" if code != 202 else "")

    return httpx.MockTransport(handle), answered


def test_retryable_failures_are_retried_within_retry_for() -> None:
    transport, answered = _flaky([503, 429, 503])
    slept: list[float] = []
    now = [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    assert post_events("http://ctl", "t", _events(2), retry_for_s=60, transport=transport, sleep=sleep,
                       clock=lambda: now[0]) == 2
    assert answered == [503, 429, 503, 202]
    assert slept == [0.5, 1.0, 2.0]


def test_retrying_stops_at_retry_for_and_never_retries_a_refusal() -> None:
    transport, answered = _flaky([503] * 100)
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with pytest.raises(ExternalError) as err:
        post_events("http://ctl", "t", _events(1), retry_for_s=5, transport=transport, sleep=sleep,
                    clock=lambda: now[0])
    assert "503" in str(err.value) and now[0] <= 5 and len(answered) == 4  # 0.5 + 1 + 2, then 4 > 5 - 3.5
    refused, answered2 = _flaky([401])
    with pytest.raises(ExternalError):
        post_events("http://ctl", "t", _events(1), retry_for_s=60, transport=refused, sleep=sleep)
    assert answered2 == [401]
