from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.schedulers.slurm.checkpoint import marker_time, parse_checkpoint, parse_signal, with_checkpoint


@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
       at=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)))
def test_token_round_trip_keeps_other_text(text: str, at: datetime) -> None:
    comment = with_checkpoint(text, at)
    assert parse_checkpoint(comment) == at
    again = with_checkpoint(comment, at + timedelta(hours=1))
    assert parse_checkpoint(again) == at + timedelta(hours=1)
    assert again.count("gpufleet:checkpoint=") == 1


def test_parse_absent_or_garbled() -> None:
    assert parse_checkpoint("") is None
    assert parse_checkpoint("just a comment") is None
    assert parse_checkpoint("gpufleet:checkpoint=yesterday") is None


def test_other_zone_converted_to_utc() -> None:
    at = datetime(2026, 11, 21, 14, 0, tzinfo=timezone(timedelta(hours=1)))
    assert with_checkpoint("", at) == "gpufleet:checkpoint=2026-11-21T13:00:00Z"


def test_naive_time_rejected() -> None:
    with pytest.raises(InvalidInput) as err:
        with_checkpoint("", datetime(2026, 11, 21))
    assert err.value.field == "checkpoint time"


def test_marker_time_is_mtime(tmp_path: Path) -> None:
    marker = tmp_path / "ckpt.done"
    marker.write_text("")
    os.utime(marker, (1795265000, 1795265000))
    assert marker_time(marker) == datetime.fromtimestamp(1795265000, UTC)
    with pytest.raises(NotFound):
        marker_time(tmp_path / "missing")


def test_sub_second_precision_kept() -> None:
    at = datetime(2026, 11, 21, 13, 4, 36, 512000, tzinfo=UTC)
    assert with_checkpoint("", at) == "gpufleet:checkpoint=2026-11-21T13:04:36.512000Z"
    assert parse_checkpoint(with_checkpoint("", at)) == at


def test_signal_token_is_the_jobs_opt_in() -> None:
    assert parse_signal("run 7 gpufleet:signal=USR1 gpufleet:checkpoint=2026-11-21T12:00:00Z") == "USR1"
    assert parse_signal("gpufleet:signal=sigusr2") == "USR2"
    assert parse_signal("run 7") == ""  # no token: no opt-in
    assert parse_signal("gpufleet:signal=") == ""
    assert parse_signal("gpufleet:signal=BOGUS") == ""  # a garbled opt-in is no opt-in
    assert parse_signal("gpufleet:signal=9") == ""  # numbers are refused: KILL is no checkpoint request
