"""``gpufleet agent``: what agent.toml and the environment say is not overridden by options left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app

runner = CliRunner()


def _inventory(tmp_path: Path, toml: str, *args: str) -> tuple[int, str, BaseException | None]:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(toml)
    res = runner.invoke(
        app, ["agent", "--config", str(cfg), "--state-dir", str(tmp_path / "state"), "--print-inventory", *args]
    )
    return res.exit_code, res.stdout, res.exception


def test_device_and_push_from_the_config_are_not_overridden_by_the_option_defaults(tmp_path: Path) -> None:
    code, out, exc = _inventory(tmp_path, 'node = "r01-n01"\ndevice = "sim"\ngpus = 2\npush = false\n')
    assert code == 0, exc
    assert len(json.loads(out)["gpus"]) == 2  # the simulated device the file asked for, not NVML


def test_device_and_push_from_the_environment_are_not_overridden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_AGENT_DEVICE", "sim")
    monkeypatch.setenv("GPUFLEET_AGENT_PUSH", "false")
    code, out, exc = _inventory(tmp_path, 'node = "r01-n01"\ngpus = 3\n')
    assert code == 0, exc
    assert len(json.loads(out)["gpus"]) == 3


def test_options_given_still_win_over_the_config(tmp_path: Path) -> None:
    toml = 'node = "r01-n01"\ndevice = "nvml"\ngpus = 2\n'
    code, out, exc = _inventory(tmp_path, toml, "--device", "sim", "--no-push")
    assert code == 0, exc
    assert len(json.loads(out)["gpus"]) == 2
