"""agent/nvlinkmap.py: the agent captures ``nvidia-smi nvlink -R`` itself when no map file is configured.

A fake ``nvidia-smi`` (a shell script) prints the DGX A100 capture of tests/fixtures (NVSentinel's test
data, see tests/unit/diagnose/test_nvlink_remote.py), fails, or prints a node without NVLink.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from gpufleet.agent.nvlinkmap import CAPTURE_FILE, capture_nvlink_remote
from gpufleet.diagnose.nvlink_remote import load_nvlink_remote
from tests.unit.diagnose.conftest import FIXTURES

CAPTURE = FIXTURES / "nvlink-remote-a100-nvsentinel.txt"


def fake(tmp_path: Path, body: str) -> list[str]:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return [str(exe), "nvlink", "-R"]


def test_the_capture_is_read_and_kept_beside_the_agents_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    ports = capture_nvlink_remote(fake(tmp_path, f"cat {CAPTURE}"), state)
    want = load_nvlink_remote(CAPTURE)
    assert ports is not None and ports.ports == want.ports
    assert (state / CAPTURE_FILE).read_text(encoding="utf-8") == CAPTURE.read_text(encoding="utf-8")


@pytest.mark.parametrize(("body", "said"), [
    ("echo 'NVML: driver not loaded' >&2; exit 9", "exited 9"),
    ("echo 'GPU 0: NVIDIA A100-PCIE-40GB (UUID: GPU-1)'", "no NVLink switch links"),
    ("echo '\tLink 0: Remote Device 00000000:C7:00.0: Link 24'", "could not read"),
])
def test_no_map_is_said_once_and_nothing_is_kept(tmp_path: Path, body: str, said: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "gpufleet.agent.nvlinkmap"):
        assert capture_nvlink_remote(fake(tmp_path, body), tmp_path) is None
    assert said in caplog.text
    assert not (tmp_path / CAPTURE_FILE).exists()


def test_no_nvidia_smi_is_not_an_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "gpufleet.agent.nvlinkmap"):
        assert capture_nvlink_remote([str(tmp_path / "absent"), "nvlink", "-R"], tmp_path) is None
    assert "SXid switch ports are reported without the GPU behind them" in caplog.text
