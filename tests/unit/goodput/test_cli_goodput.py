"""``gpufleet goodput report`` on a run directory written by the recorder."""

from __future__ import annotations

import json
from pathlib import Path

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
