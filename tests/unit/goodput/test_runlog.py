"""The durable run log: what RunRecorder writes, how a crash and a restart read back, and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.durable import RunRecorder, rank_file, read_run
from gpufleet.goodput.runlog import job_run, parse_rank_log
from gpufleet.goodput.runreport import run_report
from gpufleet.goodput.timeline import TimelineEventKind as K


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _rec(run: Path, clock: Clock, launched: float) -> RunRecorder:
    return RunRecorder(run, rank=0, world=1, launched=launched, monotonic=clock, wall=clock, fsync="never")


def _crash_and_resume(run: Path) -> None:
    """Hand-checked: start 1000; 5 s start-up; steps 0-9 of 1 s with an async checkpoint of the state
    after 5 steps (0.5 s stall, durable during step 6); killed after step 9 (no end); back 10 s later;
    3 s start-up, 1 s restore of step 5, steps 5-11, end."""
    c = Clock(1000.0)
    r = _rec(run, c, 1000.0)
    c.t += 5
    for s in range(10):
        with r.step(s, tokens=100):
            c.t += 1
        if s == 4:
            r.checkpoint_start(5, 5, is_async=True)
            c.t += 0.5
            r.checkpoint_end(5)
        if s == 6:
            r.checkpoint_persisted(5, 5)
    r.close()  # SIGKILL: nothing more is written
    c.t += 10
    r = _rec(run, c, c.t)
    c.t += 3
    r.restore_start()
    c.t += 1
    r.restore_end(5)
    for s in range(5, 12):
        with r.step(s, tokens=100):
            c.t += 1
    r.end()
    r.close()


def test_a_crash_and_a_resume_read_back_as_one_restart(tmp_path: Path) -> None:
    _crash_and_resume(tmp_path)
    rep = run_report(read_run(tmp_path))
    g = rep.goodput
    assert g.elapsed == pytest.approx(36.5)
    assert g.productive == pytest.approx(12.0)  # steps 0-4 once, 5-11 in the second attempt
    assert g.ettr == pytest.approx(12.0 / 36.5)
    assert g.badput.lost_progress == pytest.approx(5.0)  # steps 5-9 of the first attempt
    assert g.badput.waiting == pytest.approx(10.0)
    assert g.badput.startup == pytest.approx(8.0)
    assert g.badput.checkpoint_save == pytest.approx(0.5)
    assert g.badput.checkpoint_restore == pytest.approx(1.0)
    assert g.interruptions.by_cause == (("unrecorded", 1),)
    assert len(rep.restarts) == 1 and rep.restarts[0].resumed == 5 and rep.restarts[0].reached == 9
    assert rep.steps_redone == 5 and rep.steps_kept == 12 and rep.steps_run == 17
    assert rep.tokens_kept == 1200


def test_a_torn_last_line_is_skipped_and_the_next_attempt_starts_on_a_fresh_line(tmp_path: Path) -> None:
    c = Clock(50.0)
    r = _rec(tmp_path, c, 50.0)
    with r.step(0):
        c.t += 1
    r.close()
    path = rank_file(tmp_path, 0)
    with path.open("a") as f:
        f.write('{"t":51.5,"ev":"st')  # the node died inside a write
    assert parse_rank_log(path.read_text()).torn_lines == 1
    r = _rec(tmp_path, c, 60.0)
    with r.step(1):
        c.t += 1
    r.end()
    r.close()
    log = parse_rank_log(path.read_text(), "f")
    assert log.torn_lines == 1 and len(log.attempts) == 2
    assert [x.step for x in log.attempts[1].records if x.step is not None] == [1]


def test_a_bad_line_in_the_middle_is_an_error_naming_it(tmp_path: Path) -> None:
    text = ('{"ev":"attempt","launched":1,"rank":0,"world":1}\nnot json\n{"t":2,"ev":"end"}\n')
    with pytest.raises(InvalidInput) as err:
        parse_rank_log(text, "r0")
    assert err.value.field == "r0:2"
    with pytest.raises(InvalidInput) as err:
        parse_rank_log('{"ev":"attempt","launched":1,"rank":0,"world":1}\n{"t":2,"ev":"step","step":1,"dur":1,"x":3}\n',
                       "r0")
    assert err.value.field == "r0:2.x"
    with pytest.raises(InvalidInput) as err:
        parse_rank_log('{"t":2,"ev":"end"}\n', "r0")
    assert err.value.field == "r0:1.ev"


def _lines(*docs: dict[str, object]) -> str:
    return "".join(json.dumps(d) + "\n" for d in docs)


def test_a_repeated_step_in_one_attempt_is_an_in_process_restart() -> None:
    text = _lines({"ev": "attempt", "launched": 0, "rank": 0, "world": 1},
                  *({"t": s + 1.0, "ev": "step", "step": s, "dur": 1.0} for s in range(6)),
                  {"t": 8.0, "ev": "restore_start"}, {"t": 9.0, "ev": "restore_end", "step": 3},
                  *({"t": 10.0 + s - 3, "ev": "step", "step": s, "dur": 1.0} for s in range(3, 8)),
                  {"t": 15.0, "ev": "end"})
    run = job_run(parse_rank_log(text))
    assert [(r.reached, r.resumed, r.inferred) for r in run.restarts] == [(5, 3, True)]
    assert run.restarts[0].steps_redone == 3
    kinds = [(e.time, e.kind) for e in run.timeline.events if e.kind is not K.STEP]
    assert kinds == [(0.0, K.START), (8.0, K.FAILURE), (8.0, K.RESTART), (8.0, K.RESTORE_START),
                     (9.0, K.RESTORE_END), (15.0, K.END)]


def test_a_lagging_clock_on_the_next_attempt_never_runs_time_backwards() -> None:
    text = _lines({"ev": "attempt", "launched": 100, "rank": 0, "world": 1},
                  {"t": 110.0, "ev": "step", "step": 0, "dur": 2.0},
                  {"ev": "attempt", "launched": 105, "rank": 0, "world": 1},  # another node, 5 s behind
                  {"t": 108.0, "ev": "step", "step": 0, "dur": 1.0}, {"t": 109.0, "ev": "end"})
    tl = job_run(parse_rank_log(text)).timeline
    times = [e.time for e in tl.events]
    assert times == sorted(times)
    assert tl.events[-1].time == pytest.approx(114.0)  # shifted by the 5 s the clock lagged


def test_an_exception_in_the_loop_is_recorded_as_a_failure(tmp_path: Path) -> None:
    c = Clock(0.0)
    with pytest.raises(ZeroDivisionError), _rec(tmp_path, c, 0.0) as r:
        with r.step(0):
            c.t += 1
        _ = 1 / 0
    rep = run_report(read_run(tmp_path))
    assert rep.goodput.interruptions.by_cause == (("ZeroDivisionError", 1),)


def test_ranks_come_from_the_environment_and_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    r = RunRecorder(tmp_path)
    r.close()
    head = json.loads(rank_file(tmp_path, 3).read_text().splitlines()[0])
    assert (head["rank"], head["world"], head["job"]) == (3, 4, "77")
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(InvalidInput) as err:
        RunRecorder(tmp_path)
    assert err.value.field == "rank"


def test_an_input_wait_is_data_wait_badput_not_training(tmp_path: Path) -> None:
    c = Clock(0.0)
    r = _rec(tmp_path, c, 0.0)
    for s in range(3):
        with r.data_wait():
            c.t += 0.25
        with r.step(s):
            c.t += 1
    r.end()
    r.close()
    g = run_report(read_run(tmp_path)).goodput
    # the first wait precedes the first step: start-up; the next two are data waits
    assert (g.badput.startup, g.badput.data_wait, g.productive) == pytest.approx((0.25, 0.5, 3.0))
    assert g.productive + g.badput.total == pytest.approx(g.elapsed)


@pytest.mark.parametrize("period", ["0", "-5", "soon", "nan"])
def test_a_bad_push_period_is_refused_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             period: str) -> None:
    """0 made the push process post in a tight loop; a typo killed it where nobody looks."""
    import subprocess

    monkeypatch.setenv("GPUFLEET_GOODPUT_PUSH_PERIOD", period)
    started: list[object] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(InvalidInput) as err:
        RunRecorder(tmp_path, rank=0, world=1, push=True)
    assert err.value.field == "GPUFLEET_GOODPUT_PUSH_PERIOD" and not started
    assert not (tmp_path / "goodput-rank0.jsonl").exists()


def test_the_push_process_refuses_a_period_that_is_not_positive(tmp_path: Path) -> None:
    from gpufleet.goodput.push import GoodputPusher, main

    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path), "--follow", "--period", "0"])
    assert exit_.value.code == 2
    import threading

    with pytest.raises(InvalidInput):
        GoodputPusher(tmp_path, "http://127.0.0.1:1", "t").follow(threading.Event(), period_s=0)


def test_a_finished_run_is_not_appended_to_unless_asked(tmp_path: Path) -> None:
    """The crash-and-resume run ended: a new attempt in its directory would read back as a restart of the
    finished run (its gap badput, its steps redone) and is refused naming the directory; asked for (a
    resume from its checkpoint, training extended), it continues the run. A crash's log (no end) and a
    torn last line are resumed as before."""

    _crash_and_resume(tmp_path)
    before = (tmp_path / "goodput-rank0.jsonl").read_bytes()
    with pytest.raises(InvalidInput) as err:
        _rec(tmp_path, Clock(5000.0), 5000.0)
    assert err.value.field == "run_dir" and err.value.value == str(tmp_path) and "append_after_end" in str(err.value)
    assert (tmp_path / "goodput-rank0.jsonl").read_bytes() == before  # nothing written
    c = Clock(5000.0)
    r = RunRecorder(tmp_path, rank=0, world=1, launched=c.t, monotonic=c, wall=c, fsync="never",
                    append_after_end=True)
    r.end()
    r.close()
    assert len(run_report(read_run(tmp_path)).restarts) == 2
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "goodput-rank0.jsonl").write_bytes(before + b'{"ev":"attempt","form')  # killed mid-write
    _rec(torn, Clock(6000.0), 6000.0).close()  # resumes
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "goodput-rank0.jsonl").write_bytes(before.rsplit(b'{"t"', 1)[0])  # the end record never written
    _rec(crashed, Clock(6000.0), 6000.0).close()
