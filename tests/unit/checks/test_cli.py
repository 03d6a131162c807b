"""The CPU path end to end through the real command line (a subprocess, as a user or Slurm runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.unit.checks.controller_server import controller

GPUFLEET = str(Path(sys.executable).parent / "gpufleet")
REQUIRED = {"check", "gpu", "value", "unit", "expected", "status"}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GPUFLEET, "check", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_quick_level_on_cpu_json_and_posting(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with controller() as ctl:
        proc = _run(
            "--level",
            "quick",
            "--device",
            "cpu",
            "--json",
            "--node",
            "ci-n1",
            "--controller",
            ctl.url,
            "--token-file",
            str(token),
        )
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert (
        report["format"] == "gpufleet.check/v1" and report["level"] == "quick" and report["device"] == "cpu"
    )
    checks = {r["check"] for r in report["results"]}
    assert {"gemm_fp32", "gemm_bf16", "hbm_copy", "pcie_h2d", "pcie_d2h", "sdc", "nccl_allreduce"} <= checks
    for r in report["results"]:
        assert r.keys() >= REQUIRED
        assert r["status"] in ("pass", "warn", "fail")
    assert any(s.startswith("gemm_tf32") for s in report["skipped"])  # no TF32 on a CPU
    # Exit code follows the verdict.
    assert proc.returncode == (1 if report["status"] == "fail" else 0)
    # Every result was posted as one event.
    (body,) = ctl.bodies
    events = body["events"]
    assert isinstance(events, list) and len(events) == len(report["results"])
    assert {e["attrs"]["check"] for e in events} == checks
    assert all(e["node"] == "ci-n1" and e["source"] == "check" for e in events)
    assert "posted" in proc.stderr


def test_table_output_and_bad_input_exit_codes() -> None:
    proc = _run("--level", "quick", "--device", "cpu", "--cpu-devices", "1", "--dtypes", "fp32")
    assert proc.returncode in (0, 1), proc.stderr
    assert "gemm_fp32" in proc.stdout and "overall:" in proc.stdout
    assert "nccl_allreduce: needs at least 2 GPUs" in proc.stdout
    bad = _run("--level", "extreme")
    assert bad.returncode == 2 and "--level: got 'extreme'" in bad.stderr
    bad_dtype = _run("--device", "cpu", "--dtypes", "fp64")
    assert bad_dtype.returncode == 2 and "--dtypes: got 'fp64'" in bad_dtype.stderr
    no_token = _run("--controller", "http://127.0.0.1:9")
    assert no_token.returncode == 2 and "--token-file" in no_token.stderr


def test_unreachable_controller_exits_5(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    from gpufleet.checks.collective import free_port

    proc = _run(
        "--device",
        "cpu",
        "--cpu-devices",
        "1",
        "--dtypes",
        "fp32",
        "--json",
        "--controller",
        f"http://127.0.0.1:{free_port()}",
        "--token-file",
        str(token),
        "--retry-for",
        "1s",
    )
    assert proc.returncode == 5, proc.stderr
    assert "controller: cannot reach" in proc.stderr
    assert "retrying in 0.5 s" in proc.stderr  # tried again within --retry-for, then gave up
    assert json.loads(proc.stdout)["results"]  # the report is still printed before posting fails


def test_package_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import gpufleet.cli, gpufleet.checks.fleet, gpufleet.checks.judge, gpufleet.checks.pairing\n"
        "import gpufleet.checks.events, gpufleet.checks.baselines, gpufleet.checks.launch\n"
        "from gpufleet.checks._torch import require_torch\n"
        "from gpufleet.domain.errors import ExternalError\n"
        "try:\n    require_torch()\nexcept ExternalError as e:\n    print(e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "install torch==2.13.0" in proc.stdout


def test_cli_without_torch_says_how_to_install_it(tmp_path: Path) -> None:
    shim = tmp_path / "torch.py"
    shim.write_text("raise ImportError('torch is not installed here')\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [GPUFLEET, "check", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 5
    assert "install torch==2.13.0" in proc.stderr
