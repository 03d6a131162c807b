"""The vendor-neutral core of the tracker export: the series is the report's intervals (its last ETTR is the
report's), events merge once each, a missing extra is named, and the in-loop exporter never raises into
training and delivers every point once after the tracker comes back."""

from __future__ import annotations

import builtins
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpufleet.goodput.durable import read_run
from gpufleet.goodput.runreport import run_report
from gpufleet.goodput.tracker_loop import TrackerLoop
from gpufleet.goodput.trackers import InfraEvent, SeriesPoint, goodput_series, goodput_totals, merge_events
from tests.unit.goodput.test_intervals import _run


@pytest.fixture
def run(tmp_path: Path) -> Path:
    _run(tmp_path / "run")  # start-up, steps, a durable checkpoint, a crash, a restart with lost work, end
    return tmp_path / "run"


def test_the_series_is_one_point_per_interval_and_ends_at_the_reports_ettr(run: Path) -> None:
    r = run_report(read_run(run))
    series = goodput_series(r)
    assert len(series) == len(r.intervals) >= 3
    assert [p.time for p in series] == [i.end for i in r.intervals]
    assert series[-1].metrics["goodput/ettr"] == pytest.approx(r.goodput.ettr, abs=1e-9)
    assert series[-1].metrics["goodput/elapsed_s"] == pytest.approx(r.goodput.elapsed, abs=1e-6)
    # per interval: productive + badput fill the interval
    for p, i in zip(series, r.intervals, strict=True):
        bad = sum(v for k, v in p.metrics.items() if k.startswith("goodput/badput_s/"))
        assert p.metrics["goodput/productive_s"] + bad == pytest.approx(i.end - i.start, abs=1e-6)
        assert p.metrics.get("goodput/mfu") == i.mfu
    assert [p.step for p in series] == sorted(p.step for p in series) and series[-1].step == r.steps_run
    lost = sum(p.metrics.get("goodput/badput_s/lost_progress", 0.0) for p in series)
    assert lost == pytest.approx(r.goodput.badput.lost_progress, abs=1e-6) and lost > 0
    totals = goodput_totals(r)
    assert totals["goodput_total/ettr"] == r.goodput.ettr and totals["goodput_total/restarts"] == len(r.restarts)


def test_events_from_the_controller_parse_and_merge_once_each() -> None:
    doc = {"time": "2026-11-21T12:00:00Z", "node": "n1", "source": "event", "kind": "xid", "severity": "fatal",
           "component": "n1-gpu3", "code": 79, "message": "fell off the bus", "attrs": {"event_id": "e1"}}
    e = InfraEvent.from_doc(doc)
    assert e.time == 1795262400.0 and e.code == 79 and e.attrs == {"event_id": "e1"}
    assert e.row()[0] == "2026-11-21T12:00:00.000000+00:00" and e.row()[-1] == '{"event_id": "e1"}'
    earlier = InfraEvent(e.time - 60, "n2", "transition", "draining", "drain")
    assert merge_events([e], [earlier, e]) == [earlier, e]


@pytest.mark.parametrize(("module", "extra"), [("gpufleet.goodput.mlflow_export", "mlflow"),
                                               ("gpufleet.goodput.wandb_export", "wandb")])
def test_a_missing_tracker_library_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch, module: str,
                                                              extra: str) -> None:
    real_import = builtins.__import__

    def no_tracker(name: str, *args: Any, **kw: Any) -> Any:
        if name.split(".", maxsplit=1)[0] == extra:
            raise ImportError(f"No module named {extra!r}")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_tracker)
    monkeypatch.delitem(sys.modules, module, raising=False)
    mod = __import__(module, fromlist=["x"])  # importing the backend works; building one says what is missing
    cls = mod.MlflowExporter if extra == "mlflow" else mod.WandbExporter
    with pytest.raises(ImportError, match=rf"pip install 'gpufleet\[{extra}\]'"):
        cls()


class FlakyTracker:
    """A tracker that refuses the first ``down`` calls (as one that is unreachable does), then takes all."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.points: list[SeriesPoint] = []
        self.totals: dict[str, float] = {}
        self.events: list[InfraEvent] = []

    def _call(self) -> None:
        if self.down > 0:
            self.down -= 1
            raise ConnectionError("tracker unreachable")

    def log_series(self, points: Sequence[SeriesPoint]) -> None:
        self._call()
        self.points.extend(points)

    def log_totals(self, totals: Mapping[str, float], step: int) -> None:
        self._call()
        self.totals.update(totals)

    def log_events(self, events: Sequence[InfraEvent]) -> None:
        self._call()
        self.events = list(events)

    def close(self) -> None:
        pass


def test_a_tracker_that_is_down_costs_nothing_and_gets_every_point_once_when_back(run: Path) -> None:
    tracker = FlakyTracker(down=2)
    loop = TrackerLoop(run, tracker, period_s=3600)
    loop.round()
    loop.round()
    assert (loop.counts.tracker_errors, tracker.points) == (2, [])
    loop.round()
    loop.round(final=True)
    r = run_report(read_run(run))
    assert [p.time for p in tracker.points] == [i.end for i in r.intervals]  # each once, in order
    assert tracker.totals["goodput_total/ettr"] == r.goodput.ettr
    assert loop.counts.points_logged == len(r.intervals)


def test_a_controller_that_is_down_is_counted_and_the_series_still_goes(run: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    tracker = FlakyTracker(down=0)
    loop = TrackerLoop(run, tracker, controller=f"http://127.0.0.1:{port}", token="t", job="1", period_s=3600)
    loop.round()
    assert loop.counts.controller_errors == 1 and len(tracker.points) >= 3


@pytest.mark.parametrize(("kw", "field"), [({"period_s": 0}, "period_s"), ({"max_events": 0}, "max_events"),
                                           ({"controller": "ctl:8080"}, "controller")])
def test_bad_loop_settings_are_named(run: Path, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(Exception, match=rf"^{field}: got"):
        TrackerLoop(run, FlakyTracker(0), **kw)


@pytest.mark.parametrize("period", ["often", "0", "-1"])
def test_from_env_names_a_bad_tracker_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, period: str) -> None:
    from gpufleet.domain.errors import InvalidInput

    monkeypatch.setenv("GPUFLEET_TRACKER_PERIOD", period)
    monkeypatch.delenv("GPUFLEET_CONTROLLER", raising=False)
    with pytest.raises(InvalidInput) as err:
        TrackerLoop.from_env(tmp_path, FlakyTracker(0))
    assert err.value.field == "GPUFLEET_TRACKER_PERIOD"


def test_from_env_takes_the_tracker_period_as_seconds_or_a_duration(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_CONTROLLER", raising=False)
    for written, seconds in (("90", 90.0), ("2m", 120.0)):
        monkeypatch.setenv("GPUFLEET_TRACKER_PERIOD", written)
        assert TrackerLoop.from_env(tmp_path, FlakyTracker(0)).period_s == seconds
