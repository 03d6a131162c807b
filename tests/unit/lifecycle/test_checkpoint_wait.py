"""The checkpoint wait's deadline: a GPU-hours budget, bounded by the grace and the timeout."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput
from gpufleet.lifecycle.checkpoint import CheckpointWait, job_gpus

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
H = timedelta(hours=1)


def wait(gpus: int, basis: datetime, *, budget: float = 64.0, requested: datetime = T0,
         grace: timedelta = timedelta(minutes=10), timeout: timedelta = 24 * H) -> CheckpointWait:
    return CheckpointWait(T0, requested, ("7",), gpus, basis, budget, grace, timeout, "USR1")


def test_small_job_waits_until_its_budget_is_used() -> None:
    w = wait(16, T0 - H)  # 16 GPUs, last checkpoint an hour ago: 16 GPU-hours at risk already
    assert w.at_risk(T0) == pytest.approx(16.0)
    assert w.deadline == T0 + 3 * H  # 64 GPU-hours are reached 4 h after the checkpoint
    assert w.at_risk(w.deadline) == pytest.approx(64.0)


def test_large_job_over_budget_still_gets_the_grace() -> None:
    w = wait(4096, T0 - 2 * H)  # 8192 GPU-hours at risk when asked
    assert w.deadline == T0 + timedelta(minutes=10)


def test_timeout_caps_the_wait_from_the_decision() -> None:
    w = wait(1, T0, timeout=2 * H, requested=T0 + timedelta(minutes=5))  # 64 h of budget for one GPU
    assert w.deadline == T0 + 2 * H


def test_unknown_gpus_wait_for_the_timeout() -> None:
    assert wait(0, T0, timeout=H).deadline == T0 + H


def test_progress_round_trips_and_takes_the_current_limits() -> None:
    w = wait(16, T0 - H)
    p = w.progress(T0 + H)
    assert p["gpu_hours_at_risk"] == "32.00" and p["deadline"] == (T0 + 3 * H).isoformat()
    back = CheckpointWait.of_progress(p, grace=w.grace, timeout=w.timeout)
    assert back == w
    shorter = CheckpointWait.of_progress(p, grace=w.grace, timeout=H)
    assert shorter is not None and shorter.deadline == T0 + H
    assert CheckpointWait.of_progress({}, grace=w.grace, timeout=w.timeout) is None


def test_a_garbled_progress_record_names_the_field() -> None:
    with pytest.raises(InvalidInput) as err:
        CheckpointWait.of_progress({"checkpoint_requested": "yesterday"}, grace=H, timeout=H)
    assert err.value.field == "action.progress"


def test_job_gpus_prefers_what_the_scheduler_reports() -> None:
    assert job_gpus(12, 4, 8) == 12
    assert job_gpus(0, 4, 8) == 32
    assert job_gpus(0, 0, 8) == 8


@given(gpus=st.integers(1, 100_000), since_ckpt=st.integers(0, 48 * 3600), budget=st.floats(0.1, 1e5),
       grace_s=st.integers(0, 3600), timeout_s=st.integers(1, 48 * 3600))
def test_deadline_is_within_grace_and_timeout(gpus: int, since_ckpt: int, budget: float, grace_s: int,
                                              timeout_s: int) -> None:
    grace, timeout = timedelta(seconds=grace_s), timedelta(seconds=timeout_s)
    w = wait(gpus, T0 - timedelta(seconds=since_ckpt), budget=budget, grace=grace, timeout=timeout)
    assert w.deadline <= T0 + timeout
    assert w.deadline >= min(T0 + grace, T0 + timeout)
    if T0 + grace < w.deadline < T0 + timeout:  # set by the budget: exactly the budget is at risk then
        one_us = gpus / 3.6e9  # GPU-hours in the microsecond a datetime rounds to
        assert w.at_risk(w.deadline) == pytest.approx(budget, rel=1e-6, abs=2 * one_us)
