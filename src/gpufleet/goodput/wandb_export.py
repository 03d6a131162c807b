"""The Weights & Biases backend of the tracker export (``pip install 'gpufleet[wandb]'``).

In the W&B UI:

* **Charts** — ``goodput/ettr``, ``goodput/mfu``, ``goodput/productive_s``,
  ``goodput/badput_s/<category>``, ``goodput/steps``: one ``wandb.log`` row per final interval, plotted
  against ``goodput/elapsed_s`` (``define_metric``: the goodput panels get their own x-axis and do not
  depend on the training loop's step);
* **Summary** — ``goodput_total/...``: the run's totals (ETTR, MTTF, restarts, badput, MFU);
* **Table** — ``infra/events``: a ``wandb.Table`` of the infrastructure events on the job's nodes
  (columns time, node, source, kind, severity, component, code, message, attrs), logged again, whole,
  when it changes (the panel shows the latest).

``run``: log into that run (the training script's ``wandb.run``; each point is then one more row of its
history). Without it a run is started in ``project`` on first use (``mode="offline"`` and ``dir`` go to
``wandb.init``; ``WANDB_MODE``/``WANDB_DIR`` work as usual) and finished on :meth:`close`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.trackers import EVENT_COLUMNS, InfraEvent, SeriesPoint, missing_extra

X_AXIS = "goodput/elapsed_s"
EVENTS_KEY = "infra/events"


class WandbExporter:
    def __init__(self, run: Any = None, *, project: str = "gpufleet", name: str | None = None,
                 mode: str | None = None, dir: str | None = None) -> None:
        try:
            import wandb
        except ImportError as err:
            raise missing_extra("wandb", "wandb", err) from err
        if mode not in (None, "online", "offline", "disabled"):
            raise InvalidInput("mode", mode, "online, offline or disabled (W&B's modes)")
        self._wandb = wandb
        self.project, self.name, self.dir = project, name, dir
        self.mode: Literal["online", "offline", "disabled"] | None = mode  # type: ignore[assignment]
        self.run = run
        self._own_run = run is None
        self._axes = False

    def _run(self) -> Any:
        if self.run is None:
            self.run = self._wandb.init(project=self.project, name=self.name, mode=self.mode, dir=self.dir,
                                        reinit="create_new", config={"gpufleet.source": "gpufleet goodput"})
        if not self._axes:
            self.run.define_metric(X_AXIS)
            self.run.define_metric("goodput/*", step_metric=X_AXIS)
            self._axes = True
        return self.run

    def log_series(self, points: Sequence[SeriesPoint]) -> None:
        run = self._run()
        for p in points:
            run.log({**p.metrics, "goodput/steps": p.step})

    def log_totals(self, totals: Mapping[str, float], step: int) -> None:
        self._run().summary.update(dict(totals))

    def log_events(self, events: Sequence[InfraEvent]) -> None:
        run = self._run()
        table = self._wandb.Table(columns=list(EVENT_COLUMNS), data=[e.row() for e in events])
        run.log({EVENTS_KEY: table})

    def close(self) -> None:
        if self._own_run and self.run is not None:
            self.run.finish()
