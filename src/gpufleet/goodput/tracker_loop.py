"""Goodput and infrastructure events into an experiment tracker while the job trains (rank 0).

::

    from gpufleet.goodput.mlflow_export import MlflowExporter
    from gpufleet.goodput.tracker_loop import TrackerLoop

    # rank 0; the loop outside the recorder: the recorder's end is written before the loop's last round
    with TrackerLoop("runs/exp1", MlflowExporter(run_id=run.info.run_id)), RunRecorder("runs/exp1") as rec:
        ...  # the training loop; nothing else changes

A daemon thread wakes every ``period_s``: it reads the run directory (the durable log the recorder
writes; the training loop never calls into this), logs the final intervals it has not logged yet
(:func:`gpufleet.goodput.trackers.goodput_series`) and, when a controller is given, fetches the
infrastructure events on the job's nodes since the run began (``GET /v1/jobs/{job}/events``: the newest
1000 each round; at most ``max_events`` kept, newest win) and logs the table again when it changed. On
:meth:`close` it does a last round and the run's totals, waiting at most ``close_timeout_s``.

Never in training's way: a tracker or controller that is down, slow or refuses is logged as a warning and
counted (:attr:`counts`); what was not logged is tried again next round (the run directory is the spool);
the thread holds no lock the training loop takes. Its cost is reading and accounting the run log each
round, in the training process (raise ``period_s`` for very long logs, or export after the fact:
``gpufleet goodput export``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from gpufleet.domain.durations import positive_seconds
from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.durable import read_run
from gpufleet.goodput.push import fetch_job_events
from gpufleet.goodput.runreport import run_report
from gpufleet.goodput.trackers import (
    InfraEvent,
    TrackerExporter,
    goodput_series,
    goodput_totals,
    merge_events,
    run_events,
)

log = logging.getLogger(__name__)


@dataclass
class LoopCounts:
    rounds: int = 0
    points_logged: int = 0
    events_logged: int = 0
    tracker_errors: int = 0  # rounds the tracker refused or could not be reached (tried again next round)
    controller_errors: int = 0  # event fetches that failed (tried again next round)


class TrackerLoop:
    def __init__(self, run_dir: str | Path, exporter: TrackerExporter, *, controller: str = "", token: str = "",
                 job: str = "", nodes: Sequence[str] = (), period_s: float = 60.0, max_events: int = 10_000,
                 close_timeout_s: float = 30.0) -> None:
        if period_s <= 0:
            raise InvalidInput("period_s", period_s, "seconds > 0 between rounds")
        if max_events < 1:
            raise InvalidInput("max_events", max_events, "at least 1")
        if controller and not controller.startswith(("http://", "https://")):
            raise InvalidInput("controller", controller, "an http:// or https:// URL (or empty: no infra events)")
        self.run_dir, self.exporter = Path(run_dir), exporter
        self.controller, self.token, self.job, self.nodes = controller, token, job, tuple(nodes)
        self.period_s, self.max_events, self.close_timeout_s = period_s, max_events, close_timeout_s
        self.counts = LoopCounts()
        self._logged_until = float("-inf")  # end of the last interval the tracker took
        self._events: list[InfraEvent] = []
        self._events_logged: list[InfraEvent] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, run_dir: str | Path, exporter: TrackerExporter, *, period_s: float = 60.0) -> TrackerLoop:
        """Infra events from ``$GPUFLEET_CONTROLLER`` with the token in ``$GPUFLEET_TOKEN_FILE`` (a viewer
        token is enough) for ``$SLURM_JOB_ID`` (else the job the run log recorded); none when unset."""
        import os

        from gpufleet.goodput.push import controller_token

        raw = os.environ.get("GPUFLEET_TRACKER_PERIOD", "")
        if raw:
            period_s = positive_seconds(raw, "GPUFLEET_TRACKER_PERIOD")
        url = os.environ.get("GPUFLEET_CONTROLLER", "")
        token = controller_token(os.environ.get("GPUFLEET_TOKEN_FILE", "")) if url else ""
        return cls(run_dir, exporter, controller=url, token=token, job=os.environ.get("SLURM_JOB_ID", ""),
                   period_s=period_s)

    def start(self) -> TrackerLoop:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpufleet-tracker", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """One last round with the totals, then stop; returns after ``close_timeout_s`` at most."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.close_timeout_s)
            if self._thread.is_alive():
                log.warning("tracker export still busy after %.0f s (tracker slow or down); leaving it",
                            self.close_timeout_s)

    def __enter__(self) -> TrackerLoop:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.round()
        self.round(final=True)
        try:
            self.exporter.close()
        except Exception as err:
            log.warning("tracker export: closing the tracker failed: %s", err)

    def round(self, *, final: bool = False) -> LoopCounts:
        """Log what is new; never raises (failures are counted and logged)."""
        self.counts.rounds += 1
        try:
            logs = read_run(self.run_dir)
            report = run_report(logs)
        except Exception as err:  # a run directory not written yet, a torn file: next round
            log.warning("tracker export: cannot read %s yet: %s", self.run_dir, err)
            return self.counts
        series = goodput_series(report)
        new = [p for p in series if p.time > self._logged_until]
        try:
            if new:
                self.exporter.log_series(new)
                self._logged_until = new[-1].time
                self.counts.points_logged += len(new)
            if final:
                self.exporter.log_totals(goodput_totals(report), series[-1].step if series else 0)
        except Exception as err:
            self.counts.tracker_errors += 1
            log.warning("tracker export: the tracker did not take %d points (tried again next round; training "
                        "goes on): %s: %s", len(new), type(err).__name__, err)
            return self.counts
        fetched: list[InfraEvent] = []
        if self.controller:
            lead = min(logs, key=lambda lg: lg.rank)
            job = self.job or next((a.job for a in reversed(lead.attempts) if a.job), "")
            nodes = self.nodes or tuple(sorted({a.host for lg in logs for a in lg.attempts if a.host}))
            # the whole run each round (the newest 1000): an event reported late, with its own older time,
            # is still found; merging keeps each once
            try:
                fetched, _cut = fetch_job_events(self.controller, self.token, job, nodes=nodes,
                                                 since=lead.attempts[0].launched)
            except Exception as err:
                self.counts.controller_errors += 1
                log.warning("tracker export: no infrastructure events this round: %s", err)
        self._events = merge_events(self._events, fetched, run_events(report, logs))[-self.max_events:]
        if self._events and self._events != self._events_logged:
            try:
                self.exporter.log_events(self._events)
                self._events_logged = list(self._events)
                self.counts.events_logged = len(self._events)
            except Exception as err:
                self.counts.tracker_errors += 1
                log.warning("tracker export: the tracker did not take the events table: %s", err)
        return self.counts
