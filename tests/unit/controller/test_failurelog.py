"""FailureLog: a failure repeated many times is logged in full once, counted, and its end said once."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from gpufleet.controller.failurelog import FailureLog

LOG = logging.getLogger("tests.failurelog")


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def _refused() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("connection refused"))


def test_a_thirty_second_outage_is_one_traceback_one_count_and_one_line_when_it_is_over(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    fl = FailureLog(LOG, "reconciler pass", every_s=20, clock=clock)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        for _ in range(240):  # a pass every 0.125 s for 30 s
            clock.t += 0.125
            fl.failed(_refused(), "; retrying")
        fl.ok()
        fl.ok()  # nothing more to say
    records = caplog.records
    assert [r.levelname for r in records] == ["ERROR", "WARNING", "WARNING"], [r.getMessage() for r in records]
    assert records[0].exc_info is not None and "connection refused" in records[0].getMessage()
    assert "still failing: 160 more failure(s) in the last 20 s" in records[1].getMessage()
    assert records[2].getMessage().startswith("reconciler pass: working again after 240 failure(s) over 30 s")


def test_a_different_failure_is_logged_in_full_and_a_failure_after_a_quiet_while_starts_over(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    fl = FailureLog(LOG, "answering from the database", every_s=60, clock=clock)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        fl.failed(_refused(), trace=False)
        fl.failed(_refused(), trace=False)
        fl.failed(ValueError("another thing"), trace=False)
        clock.t += 61  # no success heard (a handler sees only errors), but quiet for longer than every_s
        fl.failed(_refused(), trace=False)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and "another thing" in messages[1] and "connection refused" in messages[2], messages
    assert all(r.exc_info is None for r in caplog.records)
