"""The MLflow backend of the tracker export (``pip install 'gpufleet[mlflow]'``).

In the MLflow UI:

* **Model metrics** — ``goodput/ettr``, ``goodput/mfu``, ``goodput/productive_s``,
  ``goodput/badput_s/<category>``, ``goodput/elapsed_s``: one point per final interval, with its wall-clock
  timestamp (plot them against *Time*, next to the loss) and step = the training steps run by then;
  ``goodput_total/...``: the run's totals (ETTR, MTTF, restarts, badput, MFU), at the last step.
* **Artifacts** — ``gpufleet/infra_events.json``: the infrastructure events on the job's nodes as an
  MLflow table (``log_table``: columns time, node, source, kind, severity, component, code, message,
  attrs; rows are appended as they come).
* **Tags** — ``gpufleet.infra_events`` (how many) and ``gpufleet.last_infra_event`` (the latest, one
  line), so the runs list shows which runs had trouble.

``run_id``: log into that run (the training script's own ``mlflow.active_run()``); without it a run is
created in ``experiment`` on first use (so a tracker that is down when the job starts costs nothing until
then) and ended on :meth:`close`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.goodput.trackers import EVENT_COLUMNS, InfraEvent, SeriesPoint, missing_extra

EVENTS_ARTIFACT = "gpufleet/infra_events.json"
PROBE_TIMEOUT_S = 10.0
MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch call
MAX_TAG = 5000


def probe(tracking_uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise :class:`ExternalError` (not retryable) when nothing answers HTTP at an ``http(s)://``
    tracking URI: a refused connection, an unknown host or no answer within ``timeout_s``. MLflow's
    client retries such a request with backoff for minutes (seven tries by default), so a mistyped
    ``--mlflow`` would hang the one-shot export instead of failing. Any HTTP answer, an error status
    included, is a server: what it says is left to MLflow; so is a TLS handshake this probe cannot
    verify (MLflow has its own CA and ``MLFLOW_TRACKING_INSECURE_TLS`` settings). Other URIs (``file:``,
    ``databricks``, a path) are not probed. Not for the training loop's exporter, which must start
    whether or not its tracker is up."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    import ssl
    import urllib.error
    import urllib.request

    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError) as err:
        why = getattr(err, "reason", err)
        if isinstance(why, ssl.SSLError) or isinstance(err, ssl.SSLError):
            return  # something speaks TLS there: MLflow verifies it with its own settings
        raise ExternalError("mlflow", f"no tracking server answers at {tracking_uri} ({why}); check --mlflow",
                            retryable=False) from None


class MlflowExporter:
    def __init__(self, tracking_uri: str | None = None, *, run_id: str | None = None,
                 experiment: str = "gpufleet", run_name: str | None = None) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise missing_extra("mlflow", "mlflow", err) from err
        if run_id is None and not experiment:
            raise InvalidInput("experiment", experiment, "an MLflow experiment name (or a run_id to log into)")
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment, self.run_name = experiment, run_name
        self.run_id = run_id
        self._own_run = run_id is None
        self._events_logged: set[tuple[float, str, str, str, str]] = set()

    def _run(self) -> str:
        if self.run_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.experiment)
            self.run_id = self.client.create_run(exp_id, run_name=self.run_name,
                                                 tags={"gpufleet.source": "gpufleet goodput"}).info.run_id
        return self.run_id

    def log_series(self, points: Sequence[SeriesPoint]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(k, float(v), int(p.time * 1000), p.step) for p in points for k, v in p.metrics.items()]
        self._batch(metrics)

    def log_totals(self, totals: Mapping[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._batch([Metric(k, float(v), now, step) for k, v in totals.items()])

    def _batch(self, metrics: Sequence[Any]) -> None:
        run = self._run()
        for n in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(run, metrics=metrics[n:n + MAX_BATCH])

    def log_events(self, events: Sequence[InfraEvent]) -> None:
        from mlflow.entities import RunTag

        new = [e for e in events if e.key not in self._events_logged]
        if not new:
            return
        run = self._run()
        rows = [e.row() for e in new]
        self.client.log_table(run, {c: [r[i] for r in rows] for i, c in enumerate(EVENT_COLUMNS)}, EVENTS_ARTIFACT)
        self._events_logged.update(e.key for e in new)
        last = events[-1]
        line = f"{last.row()[0]} {last.node} {last.kind}: {last.message}"[:MAX_TAG]
        self.client.log_batch(run, tags=[RunTag("gpufleet.infra_events", str(len(self._events_logged))),
                                         RunTag("gpufleet.last_infra_event", line)])

    def close(self) -> None:
        if self._own_run and self.run_id is not None:
            self.client.set_terminated(self.run_id)
