"""``gpufleet sim``: options that did nothing, or something else than meant, are refused before simulating."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.domain.errors import InvalidInput
from gpufleet.sim.compare import variants
from gpufleet.sim.config import SimConfig

runner = CliRunner()


def _sim(*args: str) -> Any:
    return runner.invoke(app, ["sim", "--replicas", "1", "--days", "1", "--gpus", "64", "--json", *args])


def test_a_bare_number_for_a_duration_is_refused_naming_the_option() -> None:
    res = _sim("--checkpoint-interval", "15")
    assert isinstance(res.exception, InvalidInput)  # main() maps it to exit 2
    assert "--checkpoint-interval" in str(res.exception) and "unit" in str(res.exception)
    assert _sim("--checkpoint-interval", "15m").exit_code == 0


def test_proactive_drain_without_warnings_is_refused() -> None:
    res = _sim("--proactive-drain")
    assert isinstance(res.exception, InvalidInput) and "--warning-fraction" in str(res.exception)
    assert _sim("--proactive-drain", "--warning-fraction", "0.5").exit_code == 0


def test_report_without_matplotlib_fails_before_simulating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    res = _sim("--report", str(tmp_path / "r.html"), "--days", "1000")  # would simulate for a long time
    assert isinstance(res.exception, InvalidInput) and "matplotlib" in str(res.exception)


def test_spare_variants_only_when_spares_are_limited() -> None:
    unlimited = [label for label, _ in variants(SimConfig())]
    assert not any("spares" in label for label in unlimited)
    limited = dict(variants(SimConfig().with_(hot_spares=2)))
    spared = [c.hot_spares for label, c in limited.items() if "spares" in label]
    assert spared and all(n is not None and n > 2 for n in spared)
