"""scripts/nvml_survey.py: the field survey run on real GPUs, here over the NVML test double."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.agent.fake_nvml import nvml_over_sim

ROOT = Path(__file__).resolve().parents[3]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvml_survey", ROOT / "scripts" / "nvml_survey.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_survey_reports_every_gpu_field_and_the_unsupported_ones(capsys: pytest.CaptureFixture[str]) -> None:
    dev, sim, _lib = nvml_over_sim(gpus=2)
    rc = _script().main(["--reads", "3", "--xid-wait", "0"], device=dev)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["status"]["ok"] is True
    assert [g["info"]["index"] for g in doc["gpus"]] == [0, 1]
    g0 = doc["gpus"][0]
    assert g0["info"]["uuid"] == sim.gpus()[0].uuid
    assert g0["fast"]["mem_total_bytes"] == sim.read_fast(0).mem_total_bytes
    assert "ecc_dbe_volatile" in g0["slow"]
    assert g0["fast_read_ms"] >= 0 and g0["slow_read_ms"] >= 0
    assert set(g0["none_fields"]) <= set(g0["fast"]) | set(g0["slow"])


def test_survey_without_a_driver_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    dev, _sim, _lib = nvml_over_sim(gpus=1, init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    rc = _script().main(["--reads", "1"], device=dev)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2
    assert doc["status"]["ok"] is False
    assert "driver" in doc["status"]["message"]


def test_survey_rejects_a_non_positive_read_count(capsys: pytest.CaptureFixture[str]) -> None:
    dev, _sim, _lib = nvml_over_sim(gpus=1)
    with pytest.raises(SystemExit):
        _script().main(["--reads", "0"], device=dev)
    assert "--reads: 0" in capsys.readouterr().err
