"""``gpufleet agent`` as operators run it (a subprocess), and the deploy manifests that run it."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.config import load_config
from tests.integration.agent.harness import wait_for
from tests.unit.agent.controller_double import free_port

ROOT = Path(__file__).resolve().parents[3]
GPUFLEET = str(Path(sys.executable).parent / "gpufleet")


def agent(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GPUFLEET, "agent", *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_nvml_without_driver_is_a_clear_message_not_a_crash(tmp_path: Path) -> None:
    out = agent(
        "--device",
        "nvml",
        "--no-push",
        "--duration",
        "2",
        "--metrics-port",
        "0",
        "--metrics-addr",
        "127.0.0.1",
        "--state-dir",
        str(tmp_path),
        "--ib-root",
        str(tmp_path / "x"),
        "--no-kmsg",
    )
    assert out.returncode == 0, out.stderr
    assert "no NVIDIA driver on this node" in out.stderr and "Traceback" not in out.stderr


def test_sim_agent_serves_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            GPUFLEET,
            "agent",
            "--device",
            "sim",
            "--gpus",
            "8",
            "--no-push",
            "--metrics-port",
            str(port),
            "--metrics-addr",
            "127.0.0.1",
            "--state-dir",
            str(tmp_path),
            "--ib-root",
            str(tmp_path / "x"),
            "--no-kmsg",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def up() -> bool:
            try:
                return "gpufleet_agent_gpus 8.0" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except httpx.HTTPError:
                return False

        wait_for(up, "the agent's /metrics", 60)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert len(re.findall(r"^DCGM_FI_DEV_GPU_TEMP\{", text, re.M)) == 8
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "signal 15: stopping" in err


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--device", "dcgm"], "--device"),
        (["--device", "sim"], "--controller"),
        (["--device", "sim", "--controller", "http://127.0.0.1:1"], "--token-file"),
        (["--device", "sim", "--gpus", "-2", "--no-push"], "gpus"),
    ],
)
def test_bad_input_exits_2_naming_the_field(args: list[str], field: str, tmp_path: Path) -> None:
    out = agent(*args, "--state-dir", str(tmp_path), "--metrics-port", "0")
    assert out.returncode == 2, out.stderr
    assert f"gpufleet: error: {field}" in out.stderr


def _help_options() -> set[str]:
    text = subprocess.run(
        [GPUFLEET, "agent", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    ).stdout
    return set(re.findall(r"--[a-z][a-z-]+", text))


def test_daemonset_matches_the_cli_and_config(tmp_path: Path) -> None:
    """Checked as text (no YAML library is a dependency): the container args are options the CLI has, and
    the ConfigMap's agent.toml loads."""
    text = (ROOT / "deploy/kubernetes/gpufleet-agent-daemonset.yaml").read_text()
    assert re.findall(r"^kind: (\w+)", text, re.M) == ["Namespace", "ConfigMap", "DaemonSet"]
    args = re.findall(r"^\s+- (--[a-z-]+)=", text, re.M)
    assert "--token-file" in args and "--device" in args
    opts = _help_options()
    assert set(args) <= opts, set(args) - opts
    block = text.split("agent.toml: |\n", 1)[1].split("\n---", 1)[0]
    toml = "\n".join(line[4:] for line in block.splitlines())
    (tmp_path / "agent.toml").write_text(toml)
    cfg = load_config(tmp_path / "agent.toml", node="n1")
    assert cfg.controller and cfg.thresholds.ib_expected_rate_gbps == 400
    assert cfg.ib_root == Path("/host/sys/class/infiniband")
    assert "containerPort: 9400" in text and "mountPath: /var/lib/gpufleet-agent" in text
    assert cfg.controller.startswith("https://") and cfg.ca_file == Path("/etc/gpufleet-tls/ca.crt")
    assert "mountPath: /etc/gpufleet-tls" in text and "{key: ca.crt, path: ca.crt}" in text


def test_systemd_unit_matches_the_cli() -> None:
    text = (ROOT / "deploy/systemd/gpufleet-agent.service").read_text().replace("\\\n", " ")
    [exec_start] = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[1] == "agent"
    opts = _help_options()
    for a in argv[2:]:
        if a.startswith("--"):
            assert a in opts, a
    assert "StateDirectory=gpufleet-agent" in text and "Restart=always" in text
