"""Goodput and infrastructure events in real experiment trackers: a real local MLflow tracking server (one
per session, read back through ``MlflowClient``) and W&B in offline mode (its ``.wandb`` file read back),
after the fact from the CLI with a real controller, and in the training loop — also with the tracker down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.goodput.durable import RunRecorder, read_run
from gpufleet.goodput.runreport import run_report
from tests.conftest import require_service
from tests.e2e.harness import ADMIN_TOKEN, Controller, Fleet, child_env, free_port, gpufleet_argv, wait_until
from tests.e2e.test_goodput_push import JOB, NODES, push_cli, write_run
from tests.unit.goodput.wandb_file import history, summary

pytestmark = [pytest.mark.e2e, pytest.mark.goodput]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` on a SQLite store and a local artifact directory, answering ``/health``."""
    exe = Path(sys.executable).with_name("mlflow")
    require_service(exe.exists(), "the mlflow server (pip install 'gpufleet[mlflow]')")
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen([str(exe), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        import httpx

        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"mlflow server exited {proc.returncode}:\n{(root / 'server.log').read_text()}")
            try:
                return httpx.get(f"{url}/health", timeout=2).text.strip() == "OK"
            except httpx.HTTPError:
                return False

        wait_until(healthy, lambda: f"mlflow server on {url}:\n{(root / 'server.log').read_text()[-3000:]}",
                   timeout=120, interval=0.25)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its uvicorn worker
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()


@pytest.fixture
def ctl(fleet: Fleet) -> Controller:
    return fleet.controller(nodes=NODES, sim_jobs=[(JOB, "train", ["n1", "n2"])])


def _export(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(gpufleet_argv("goodput", "export", *args), env=child_env(env), capture_output=True,
                         text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr + out.stdout
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def _rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]


def test_export_after_the_fact_puts_the_reports_goodput_and_the_jobs_infra_events_in_mlflow_and_wandb(
        ctl: Controller, mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    t0 = time.time() - 200
    write_run(run, t0)  # n1 and n2, a crash and restart, rank 1 on n2 slow from step 30; ended ~120 s ago
    report = run_report(read_run(run))
    push_cli(ctl, run)  # the straggler finding reaches the controller as a check_failed event on n2
    xid = {"id": "x79", "node": "n1", "kind": "xid", "code": 79, "message": "GPU has fallen off the bus",
           "time": _iso(t0 + 20)}
    before = {"id": "old", "node": "n1", "kind": "xid", "code": 79, "time": _iso(t0 - 3600)}  # before the job
    ctl.api.post("/events", {"events": [xid, before]})
    viewer = tmp_path / "token"
    viewer.write_text(ADMIN_TOKEN)
    common = ("--controller", ctl.url, "--token-file", str(viewer), "--job", JOB)

    got = _export(str(run), "--mlflow", mlflow_server, "--experiment", "e2e", *common)
    client = MlflowClient(mlflow_server)
    ettr = sorted(client.get_metric_history(got["run"], "goodput/ettr"), key=lambda m: m.timestamp)
    assert len(ettr) == len(report.intervals)
    assert [m.timestamp for m in ettr] == [int(i.end * 1000) for i in report.intervals]
    assert ettr[-1].value == pytest.approx(report.goodput.ettr, abs=1e-9)  # the report's ETTR, not another one
    metrics = client.get_run(got["run"]).data.metrics
    assert metrics["goodput_total/ettr"] == pytest.approx(report.goodput.ettr, abs=1e-9)
    assert metrics["goodput_total/restarts"] == len(report.restarts) == 1
    table = json.loads(Path(client.download_artifacts(got["run"], "gpufleet/infra_events.json",
                                                      str(tmp_path))).read_text())
    rows = _rows(table)
    _the_jobs_infra_events(rows, t0)
    assert client.get_run(got["run"]).data.tags["gpufleet.infra_events"] == str(len(rows)) == str(got["events"])

    wdir = tmp_path / "wandb"
    wdir.mkdir()
    got = _export(str(run), "--wandb", "--project", "e2e", *common,
                  env={"WANDB_MODE": "offline", "WANDB_DIR": str(wdir), "WANDB_SILENT": "true"})
    (offline,) = wdir.glob("wandb/offline-run-*")
    (log,) = offline.glob("run-*.wandb")
    points = [h for h in history(log) if "goodput/ettr" in h]
    assert len(points) == len(report.intervals)
    assert points[-1]["goodput/ettr"] == pytest.approx(report.goodput.ettr, abs=1e-9)
    assert summary(log)["goodput_total/ettr"] == pytest.approx(report.goodput.ettr, abs=1e-9)
    (tfile,) = offline.glob("files/media/table/infra/events_*.table.json")
    wrows = _rows(json.loads(tfile.read_text()))
    _the_jobs_infra_events(wrows, t0)  # the controller may have moved on since (n1 drained): not "== rows"
    assert len(wrows) == got["events"]


def _the_jobs_infra_events(rows: list[dict[str, Any]], t0: float) -> None:
    seen = {(r["node"], r["source"], r["kind"]) for r in rows}
    assert ("n1", "event", "xid") in seen, rows  # the XID during the run ...
    assert any(r["node"] == "n1" and r["source"] in ("transition", "action") for r in rows), rows  # ... its drain
    assert ("n2", "event", "check_failed") in seen and ("n2", "run", "straggler") in seen, rows
    assert not any('"event_id": "old"' in r["attrs"] for r in rows)
    assert all(r["time"] >= _iso(t0)[:19] for r in rows)  # nothing from before the run
    assert [r["time"] for r in rows] == sorted(r["time"] for r in rows)  # oldest first


def test_in_the_training_loop_mlflow_gets_the_series_and_the_infra_events_as_they_happen(
        ctl: Controller, mlflow_server: str, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from gpufleet.goodput.mlflow_export import EVENTS_ARTIFACT, MlflowExporter
    from gpufleet.goodput.tracker_loop import TrackerLoop

    client = MlflowClient(mlflow_server)
    exp = client.create_experiment(f"loop-{tmp_path.name}")
    mine = client.create_run(exp, run_name="train").info.run_id  # the training script's own run
    run = tmp_path / "run"
    t = [time.time() - 100]
    rec = RunRecorder(run, rank=0, world=1, launched=t[0], fsync="never", push=False, host="n1",
                      wall=lambda: t[0], monotonic=lambda: t[0])
    rec.model(1e12, peak_flops=1e13)
    loop = TrackerLoop(run, MlflowExporter(mlflow_server, run_id=mine), controller=ctl.url, token=ADMIN_TOKEN,
                       job=JOB, period_s=0.1).start()

    def events_logged() -> int:
        return int(client.get_run(mine).data.tags.get("gpufleet.infra_events", "0"))

    for step in range(30):
        with rec.step(step):
            t[0] += 1.0
        if step % 10 == 9:
            rec.checkpoint_start(step, step, is_async=False)
            t[0] += 0.5
            rec.checkpoint_end(step)
            rec.checkpoint_persisted(step, step)
            # the interval that checkpoint closed reaches the run while training goes on
            wait_until(lambda s=step: len(client.get_metric_history(mine, "goodput/ettr")) >= (s + 1) // 10,
                       f"goodput/ettr points for the checkpoint at step {step}", timeout=60)
        if step in (12, 22):  # something happens to the node while the job trains on it
            before = events_logged()
            ctl.api.post("/events", {"events": [{"id": f"sbe{step}", "node": "n1", "kind": "ecc_sbe",
                                                 "time": _iso(time.time())}]})
            wait_until(lambda b=before: events_logged() > b, f"the event of step {step} in the run's tags",
                       timeout=60)
    rec.end()
    rec.close()
    loop.close()
    report = run_report(read_run(run))
    ettr = sorted(client.get_metric_history(mine, "goodput/ettr"), key=lambda m: m.timestamp)
    assert len(ettr) == len(report.intervals) and loop.counts.tracker_errors == 0
    assert ettr[-1].value == pytest.approx(report.goodput.ettr, abs=1e-9)
    mfu = client.get_metric_history(mine, "goodput/mfu")
    assert [m.value for m in mfu] == pytest.approx([0.1] * len(mfu))  # 1 TFLOP per 1 s step at a 10 TFLOP/s peak
    rows = _rows(json.loads(Path(client.download_artifacts(mine, EVENTS_ARTIFACT, str(tmp_path))).read_text()))
    ids = [json.loads(r["attrs"]).get("event_id") for r in rows if r["source"] == "event"]
    assert sorted(ids) == ["sbe12", "sbe22"]  # each once: the table is appended to, not logged again
    assert client.get_run(mine).info.status == "RUNNING"  # the script's run: the script ends it, not us


def test_with_the_tracker_unreachable_training_goes_on_and_nothing_raises(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    from gpufleet.goodput.mlflow_export import MlflowExporter
    from gpufleet.goodput.tracker_loop import TrackerLoop

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    run = tmp_path / "run"
    rec = RunRecorder(run, rank=0, world=1, fsync="never", push=False)
    loop = TrackerLoop(run, MlflowExporter(f"http://127.0.0.1:{free_port()}"), period_s=0.05,
                       close_timeout_s=10).start()
    step = 0
    while loop.counts.tracker_errors < 2:  # train until the loop has failed to reach the tracker twice
        with rec.step(step):
            time.sleep(0.002)  # the step's work
            rec.checkpoint_start(step, step, is_async=False)
            rec.checkpoint_end(step)
            rec.checkpoint_persisted(step, step)
        step += 1
        assert step < 1_000_000, "the tracker loop never tried the tracker"
    rec.end()
    rec.close()
    loop.close()
    assert run_report(read_run(run)).steps_kept == step  # every step recorded
    assert loop.counts.points_logged == 0 and loop.counts.tracker_errors >= 2


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat()
