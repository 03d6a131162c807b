"""Goodput accounting against timelines computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.ettr import compute
from gpufleet.goodput.timeline import JobTimeline, TimelineEvent, TimelineEventKind

K = TimelineEventKind


def tl(*rows: tuple[float, K] | tuple[float, K, str] | tuple[float, K, str, int]) -> JobTimeline:
    out = []
    for r in rows:
        cause = r[2] if len(r) > 2 else ""
        ck = r[3] if len(r) > 3 else None
        out.append(TimelineEvent(float(r[0]), r[1], cause=cause, checkpoint=ck))  # type: ignore[misc]
    return JobTimeline(tuple(out))


def test_clean_run_with_one_blocking_checkpoint() -> None:
    # 0 start, 10 initialised, 100-110 save, 200 end: productive 90 + 90 = 180 of 200.
    r = compute(tl((0, K.START), (10, K.INITIALISED), (100, K.CHECKPOINT_SAVE_START),
                   (110, K.CHECKPOINT_SAVE_END), (200, K.END)))
    assert r.elapsed == 200
    assert r.productive == 180
    assert r.ettr == pytest.approx(0.9)
    assert r.badput.startup == 10
    assert r.badput.checkpoint_save == 10
    assert r.interruptions.total == 0
    assert r.mttf is None
    assert r.checkpoints == 1


def test_failure_loses_work_since_checkpoint_and_splits_the_gap() -> None:
    # Attempt 1: start 0, init 10, ckpt 50-55 (snapshot holds 40 s of work), fail at 95 -> 40 s lost.
    # Detected at 105 (10 s detection), restart at 125 (20 s waiting), init 135, restore 135-145, end 245.
    r = compute(tl(
        (0, K.START), (10, K.INITIALISED), (50, K.CHECKPOINT_SAVE_START), (55, K.CHECKPOINT_SAVE_END),
        (95, K.FAILURE, "gpu"), (105, K.DETECTED), (125, K.RESTART), (135, K.INITIALISED),
        (135, K.RESTORE_START), (145, K.RESTORE_END), (245, K.END),
    ))
    b = r.badput
    assert (b.startup, b.checkpoint_save, b.lost_progress, b.detection, b.waiting, b.checkpoint_restore) == (
        20, 5, 40, 10, 20, 10)
    assert r.productive == 40 + 100
    assert r.productive + b.total == pytest.approx(r.elapsed)
    assert r.interruptions.unexpected == 1
    assert r.interruptions.by_cause == (("gpu", 1),)
    # Held nodes 0..95 and 125..245 = 215 s over one failure.
    assert r.mttf == 215
    assert r.attempts == 2


def test_async_checkpoint_counts_only_once_persisted() -> None:
    # Save 1 blocks 50-51 and persists at 80; a failure at 70 loses everything since the start (59 s
    # of training); save 2 (after restart) persists before the failure at 300.
    r = compute(tl(
        (0, K.START), (0, K.INITIALISED), (50, K.CHECKPOINT_SAVE_START, "", 1),
        (51, K.CHECKPOINT_SAVE_END, "", 1), (70, K.FAILURE, "nic"), (100, K.START), (100, K.INITIALISED),
        (150, K.CHECKPOINT_SAVE_START, "", 2), (151, K.CHECKPOINT_SAVE_END, "", 2),
        (160, K.CHECKPOINT_PERSISTED, "", 2), (300, K.FAILURE, "gpu"), (300, K.END),
    ))
    # Lost: 69 s in attempt 1 (50 + 19 training), 149 s in attempt 2 after the snapshot at 150.
    assert r.badput.lost_progress == 69 + 149
    assert r.productive == 50
    assert r.checkpoints == 1


def test_planned_stop_time_is_maintenance_not_waiting() -> None:
    r = compute(tl((0, K.START), (0, K.INITIALISED), (60, K.CHECKPOINT_SAVE_START), (60, K.CHECKPOINT_SAVE_END),
                   (60, K.MAINTENANCE, "firmware"), (360, K.START), (360, K.INITIALISED), (400, K.END)))
    assert r.badput.planned_maintenance == 300
    assert r.badput.waiting == 0
    assert r.badput.lost_progress == 0
    assert r.interruptions.planned == 1 and r.interruptions.unexpected == 0
    assert r.ettr == pytest.approx(100 / 400)


def test_a_requeue_after_a_planned_stop_splits_its_downtime_from_the_wait_for_nodes() -> None:
    r = compute(tl((0, K.START), (0, K.INITIALISED), (60, K.CHECKPOINT_SAVE_START), (60, K.CHECKPOINT_SAVE_END),
                   (60, K.MAINTENANCE, "firmware"), (160, K.SUBMIT), (360, K.RESTART), (360, K.INITIALISED),
                   (400, K.END)))
    assert (r.badput.planned_maintenance, r.badput.waiting) == (100, 200)
    assert r.ignored_events == 0 and r.ettr == pytest.approx(100 / 400)
    # after a failure the requeue changes nothing: detection, then waiting
    f = compute(tl((0, K.START), (0, K.INITIALISED), (60, K.FAILURE), (90, K.DETECTED), (160, K.SUBMIT),
                   (360, K.RESTART), (360, K.INITIALISED), (400, K.END)))
    assert (f.badput.detection, f.badput.waiting, f.badput.planned_maintenance) == (30, 270, 0)
    # a SUBMIT while running is out of phase
    assert compute(tl((0, K.START), (0, K.INITIALISED), (50, K.SUBMIT), (100, K.END))).ignored_events == 1


def test_queue_time_counts_only_with_submit() -> None:
    base = [(100, K.START), (100, K.INITIALISED), (200, K.END)]
    with_submit = compute(tl((0, K.SUBMIT), *base))  # type: ignore[arg-type]
    without = compute(tl(*base))  # type: ignore[arg-type]
    assert with_submit.badput.waiting == 100 and with_submit.ettr == pytest.approx(0.5)
    assert without.ettr == pytest.approx(1.0)


def test_start_while_running_is_an_unrecorded_interruption() -> None:
    r = compute(tl((0, K.START), (0, K.INITIALISED), (50, K.START), (50, K.INITIALISED), (100, K.END)))
    assert r.interruptions.by_cause == (("unrecorded", 1),)
    assert r.badput.lost_progress == 50


def test_out_of_phase_events_are_ignored_and_counted() -> None:
    r = compute(tl((0, K.START), (0, K.INITIALISED), (10, K.FAILURE), (20, K.FAILURE),
                   (25, K.CHECKPOINT_SAVE_END), (30, K.END), (40, K.START)))
    assert r.interruptions.total == 1
    assert r.ignored_events == 3
    assert r.elapsed == 30


def test_empty_timeline() -> None:
    r = compute(JobTimeline())
    assert r.ettr == 0.0 and r.elapsed == 0.0


def test_unsorted_events_are_rejected_with_the_field() -> None:
    with pytest.raises(InvalidInput) as err:
        JobTimeline((TimelineEvent(5, K.START), TimelineEvent(1, K.END)))
    assert err.value.field == "events[1].time"


def test_non_finite_time_is_rejected() -> None:
    with pytest.raises(InvalidInput) as err:
        TimelineEvent(float("nan"), K.START)
    assert err.value.field == "time"


def test_from_datetimes_needs_aware_times_and_known_kinds() -> None:
    from datetime import UTC, datetime, timedelta

    t = datetime(2026, 11, 21, tzinfo=UTC)
    r = compute(JobTimeline.from_datetimes([(t, "start"), (t, "initialised"), (t + timedelta(hours=1), "end")]))
    assert r.elapsed == 3600 and r.ettr == 1.0
    with pytest.raises(InvalidInput):
        JobTimeline.from_datetimes([(t, "launch")])
    with pytest.raises(InvalidInput):
        JobTimeline.from_datetimes([(datetime(2026, 1, 1), "start")])


# ---- properties ---------------------------------------------------------------------------------

_KINDS = st.sampled_from(list(K))


@st.composite
def timelines(draw: st.DrawFn) -> JobTimeline:
    gaps = draw(st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=40))
    kinds = draw(st.lists(_KINDS, min_size=len(gaps), max_size=len(gaps)))
    ids = draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=len(gaps), max_size=len(gaps)))
    t, out = 0.0, []
    for g, k, i in zip(gaps, kinds, ids, strict=True):
        t += g
        out.append(TimelineEvent(t, k, checkpoint=i))
    return JobTimeline(tuple(out))


@settings(max_examples=300, deadline=None)
@given(timelines())
def test_ettr_in_unit_interval_and_time_is_conserved(t: JobTimeline) -> None:
    r = compute(t)
    assert 0.0 <= r.ettr <= 1.0
    assert r.productive + r.badput.total == pytest.approx(r.elapsed, abs=1e-6)
    assert all(v >= -1e-9 for v in r.badput.as_dict().values())


@settings(max_examples=300, deadline=None)
@given(timelines(), st.floats(0, 1, allow_nan=False), st.booleans())
def test_adding_a_failure_never_raises_ettr(t: JobTimeline, where: float, planned: bool) -> None:
    span = (t.events[0].time, t.events[-1].time)
    at = span[0] + where * (span[1] - span[0])
    kind = K.MAINTENANCE if planned else K.FAILURE
    worse = compute(t.with_event(TimelineEvent(at, kind, cause="added")))
    assert worse.ettr <= compute(t).ettr + 1e-12


def test_waiting_again_for_an_async_checkpoint_is_its_stall_not_a_new_snapshot() -> None:
    # async save of checkpoint 7: 50-52 staging; training 52-100; at the end the job waits 100-106 for
    # its upload (a second start of the same checkpoint), durable at 105. The snapshot stays at 50: a
    # failure before 105 would lose the training since 50, and the settled point is 50, not 100.
    from gpufleet.goodput.ettr import settled

    t = tl((0, K.START), (10, K.INITIALISED), (50, K.CHECKPOINT_SAVE_START, "", 7),
           (52, K.CHECKPOINT_SAVE_END, "", 7), (100, K.CHECKPOINT_SAVE_START, "", 7),
           (105, K.CHECKPOINT_PERSISTED, "", 7), (106, K.CHECKPOINT_SAVE_END, "", 7), (106, K.END))
    r = compute(t)
    assert r.checkpoints == 1
    assert r.badput.checkpoint_save == pytest.approx(2 + 6)
    assert r.productive == pytest.approx(40 + 48)
    assert [p.time for p in settled(t)] == [0, 50, 106]
