"""``gpufleet goodput report`` on a run directory written by the recorder."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.cli.errors import exit_code_for
from gpufleet.domain.errors import InvalidInput, NotFound
from tests.unit.goodput.test_runlog import _crash_and_resume


def test_report_text_and_json(tmp_path: Path) -> None:
    _crash_and_resume(tmp_path)
    out = CliRunner().invoke(app, ["goodput", "report", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "ETTR          32.88 %" in out.output and "restarts      1" in out.output
    doc = json.loads(CliRunner().invoke(app, ["goodput", "report", str(tmp_path), "--json"]).output)
    assert doc["restarts"] == 1 and doc["steps"]["redone"] == 5
    assert doc["badput_s"]["lost_progress"] == 5.0


def test_a_missing_or_empty_run_dir_is_a_clear_error(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["goodput", "report", str(tmp_path / "nope")])
    assert isinstance(out.exception, NotFound) and exit_code_for(out.exception) != 0
    out = CliRunner().invoke(app, ["goodput", "report", str(tmp_path)])
    assert isinstance(out.exception, InvalidInput) and out.exception.field == "RUN_DIR"


def test_tco_and_the_html_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _crash_and_resume(run)
    doc = json.loads(CliRunner().invoke(app, ["goodput", "report", str(run), "--json",
                                              "--price-per-gpu-hour", "3"]).output)
    t, ettr = doc["tco"], doc["ettr"]
    assert t["gpu_hours"] == doc["world"] * doc["elapsed_s"] / 3600
    assert t["cost"] == 3 * t["gpu_hours"] and abs(t["badput_cost"] - t["cost"] * (1 - ettr)) < 1e-9
    assert abs(t["per_productive_gpu_hour"] - 3 / ettr) < 1e-9
    page = tmp_path / "report.html"
    out = CliRunner().invoke(app, ["goodput", "report", str(run), "--html", str(page), "--price-per-gpu-hour", "3"])
    assert out.exit_code == 0, out.output
    assert "TCO" in out.output and str(page) in out.output
    text = page.read_text()
    assert text.count("data:image/png;base64,") >= 2 and "ETTR" in text and "http" not in text.split("<body>")[1]
    bad = CliRunner().invoke(app, ["goodput", "report", str(run), "--html", str(tmp_path / "no" / "r.html")])
    assert isinstance(bad.exception, InvalidInput) and bad.exception.field == "--html"
    neg = CliRunner().invoke(app, ["goodput", "report", str(run), "--price-per-gpu-hour", "-1"])
    assert isinstance(neg.exception, InvalidInput) and neg.exception.field == "price_per_gpu_hour"


def test_export_needs_exactly_one_tracker_and_a_token_with_a_controller(tmp_path: Path) -> None:
    _crash_and_resume(tmp_path)
    for args in ([], ["--mlflow", "http://127.0.0.1:1", "--wandb"]):
        out = CliRunner().invoke(app, ["goodput", "export", str(tmp_path), *args], env={"GPUFLEET_CONTROLLER": ""})
        assert isinstance(out.exception, InvalidInput) and out.exception.field == "--mlflow/--wandb", out.output
    out = CliRunner().invoke(app, ["goodput", "export", str(tmp_path), "--wandb", "--controller", "http://ctl:8080"],
                             env={"GPUFLEET_TOKEN_FILE": ""})
    assert isinstance(out.exception, InvalidInput) and out.exception.field == "--token-file", out.output


def test_push_by_hand_fails_on_a_run_dir_it_cannot_read_or_without_a_job(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    base = ["--controller", "http://127.0.0.1:1", "--token-file", str(token)]
    env = {"SLURM_JOB_ID": "", "GPUFLEET_CONTROLLER": "", "GPUFLEET_TOKEN_FILE": ""}
    out = CliRunner().invoke(app, ["goodput", "push", str(tmp_path / "nope"), *base, "--job", "7"], env=env)
    assert isinstance(out.exception, NotFound) and exit_code_for(out.exception) != 0, out.output
    run = tmp_path / "run"
    run.mkdir()
    out = CliRunner().invoke(app, ["goodput", "push", str(run), *base, "--job", "7"], env=env)
    assert isinstance(out.exception, InvalidInput) and out.exception.field == "RUN_DIR", out.output
    _crash_and_resume(run)  # records no job id
    out = CliRunner().invoke(app, ["goodput", "push", str(run), *base], env=env)
    assert isinstance(out.exception, InvalidInput) and out.exception.field == "--job", out.output
    out = CliRunner().invoke(app, ["goodput", "push", str(run), "--controller", "ctl:8470", "--token-file",
                                   str(token), "--job", "7"], env=env)
    assert isinstance(out.exception, InvalidInput) and out.exception.field == "--controller", out.output


def test_export_errors_name_the_option_and_never_end_in_a_traceback(tmp_path: Path, monkeypatch: Any) -> None:
    from gpufleet.domain.errors import ExternalError

    _crash_and_resume(tmp_path)  # records no job id
    token = tmp_path / "token"
    token.write_text("t")
    env = {"GPUFLEET_CONTROLLER": "", "GPUFLEET_TOKEN_FILE": ""}

    def export(*args: str) -> Any:
        return CliRunner().invoke(app, ["goodput", "export", str(tmp_path), *args], env=env).exception

    for args, field in ((["--wandb", "--wandb-mode", "offfline"], "--wandb-mode"),
                        (["--wandb", "--controller", "ctl:8470", "--token-file", str(token)], "--controller"),
                        (["--wandb", "--controller", "http://127.0.0.1:1", "--token-file", str(token)], "--job"),
                        (["--wandb", "--controller", "http://127.0.0.1:1", "--token-file", str(tmp_path / "no"),
                          "--job", "7"], "--token-file")):
        err = export(*args)
        assert isinstance(err, InvalidInput) and err.field == field, (args, err)
    # Not installed: importing mlflow raises ImportError. Its submodules too: one an earlier test in this
    # process imported would otherwise be found in sys.modules without its parent.
    hidden = ["mlflow", *(m for m in sys.modules if m.startswith("mlflow."))]
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)
    err = export("--mlflow", "http://127.0.0.1:1")
    assert isinstance(err, InvalidInput) and err.field == "--mlflow" and "gpufleet[mlflow]" in str(err), err
    for name in hidden:
        monkeypatch.delitem(sys.modules, name)
    err = export("--mlflow", "nosuchscheme://x")  # the tracker itself fails: the system is named, exit 5
    assert isinstance(err, ExternalError) and err.system == "mlflow" and "nosuchscheme://x" in str(err), err


def test_export_to_a_tracking_uri_where_nothing_listens_fails_at_once_naming_it(tmp_path: Path) -> None:
    """A mistyped ``--mlflow`` (nothing listens there): MLflow's client would retry for minutes (the test's
    60 s would end it); the export says at once that nothing answers there, and names the option."""
    import socket

    from gpufleet.domain.errors import ExternalError

    _crash_and_resume(tmp_path)
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
        env = {"GPUFLEET_CONTROLLER": "", "GPUFLEET_TOKEN_FILE": "", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
        out = CliRunner().invoke(app, ["goodput", "export", str(tmp_path), "--mlflow", uri], env=env)
    err = out.exception
    assert isinstance(err, ExternalError) and err.system == "mlflow" and not err.retryable, err
    assert uri in str(err) and "--mlflow" in str(err) and exit_code_for(err) != 0


def _declared_run(run: Path, *, model: bool = True) -> None:
    """Four steps of exactly 1 s each doing 2 TFLOP (2 TFLOP/s achieved); peak 10 TFLOP/s, bf16."""
    from gpufleet.goodput.durable import RunRecorder

    t = [1000.0]
    rec = RunRecorder(run, rank=0, world=1, launched=t[0], monotonic=lambda: t[0], wall=lambda: t[0],
                      fsync="never")
    if model:
        rec.model(2e12, peak_flops=10e12, dtype="bf16")
    for step in range(4):
        t[0] += 1.0
        rec.step_done(step, 1.0)
    rec.end()
    rec.close()


def _check_file(path: Path, fmt: str = "gpufleet.check/v1") -> Path:
    rows = [{"check": "gemm_bf16", "gpu": g, "value": v, "unit": "TFLOPS"} for g, v in enumerate((3.0, 5.0, 4.0))]
    rows.append({"check": "gemm_fp16", "gpu": 0, "value": 8.0, "unit": "TFLOPS"})
    rows.append({"check": "hbm_copy", "gpu": 0, "value": 3000.0, "unit": "GB/s"})
    path.write_text(json.dumps({"format": fmt, "node": "n1", "results": rows}))
    return path


def test_mfu_against_the_gpus_measured_ceiling_from_a_check_report(tmp_path: Path) -> None:
    # 2 TFLOP/s achieved; the check measured bf16 GEMMs of 3, 5 and 4 TFLOP/s on three GPUs (median 4)
    # and fp16 at 8: half the bf16 ceiling, a quarter of the fp16 one; 20 % of the 10 TFLOP/s peak either way
    _declared_run(tmp_path / "run")
    check = _check_file(tmp_path / "check.json")
    doc = json.loads(CliRunner().invoke(app, ["goodput", "report", str(tmp_path / "run"), "--json",
                                              "--ceiling", str(check)]).output)
    assert doc["mfu"]["training"] == 0.2
    assert doc["mfu"]["dtype"] == "bf16" and doc["mfu"]["ceiling_flops"] == 4e12
    assert doc["mfu"]["of_ceiling"] == 0.5
    text = CliRunner().invoke(app, ["goodput", "report", str(tmp_path / "run"), "--ceiling", str(check),
                                    "--ceiling-dtype", "fp16"])
    assert text.exit_code == 0, text.output
    assert "25.0 % of this GPU's measured GEMM ceiling (8 TFLOP/s" in text.output
    plain = json.loads(CliRunner().invoke(app, ["goodput", "report", str(tmp_path / "run"), "--json"]).output)
    assert plain["mfu"]["ceiling_flops"] is None and plain["mfu"]["of_ceiling"] is None


def test_a_ceiling_that_cannot_be_used_is_named(tmp_path: Path) -> None:
    _declared_run(tmp_path / "run")
    _declared_run(tmp_path / "bare", model=False)
    good = _check_file(tmp_path / "check.json")
    cases = [
        (["run", "--ceiling", str(tmp_path / "none.json")], "--ceiling", "readable"),
        (["run", "--ceiling", str(_check_file(tmp_path / "old.json", fmt="other/v0"))], "format", "gpufleet.check/v1"),
        (["run", "--ceiling", str(good), "--ceiling-dtype", "fp8"], "results", "gemm_bf16, gemm_fp16"),
        (["bare", "--ceiling", str(good)], "--ceiling", "declares no FLOPs"),
    ]
    (tmp_path / "bad.json").write_text("{not json")
    cases.append((["run", "--ceiling", str(tmp_path / "bad.json")], "--ceiling", "JSON"))
    for (run, *args), field, words in cases:
        out = CliRunner().invoke(app, ["goodput", "report", str(tmp_path / run), *args])
        assert isinstance(out.exception, InvalidInput), (args, out.output)
        assert field in out.exception.field and words in str(out.exception), (args, str(out.exception))
        assert exit_code_for(out.exception) == 2


def test_the_probe_leaves_a_tls_server_it_cannot_verify_to_mlflow(tmp_path: Path) -> None:
    """A tracking server with a private CA: the probe cannot verify its certificate, but something answers
    there, so MLflow (with its own CA setting) decides; a refused port still fails at once."""
    import socket
    import ssl
    import subprocess
    import threading

    from gpufleet.domain.errors import ExternalError
    from gpufleet.goodput.mlflow_export import probe

    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)

        def handshake_once() -> None:
            conn, _ = srv.accept()
            try:
                with ctx.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass  # the client gives up on the unverified certificate

        t = threading.Thread(target=handshake_once, daemon=True)
        t.start()
        probe(f"https://127.0.0.1:{srv.getsockname()[1]}", timeout_s=10)  # no error: left to MLflow
        t.join(10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(ExternalError):
            probe(f"https://127.0.0.1:{s.getsockname()[1]}", timeout_s=10)
