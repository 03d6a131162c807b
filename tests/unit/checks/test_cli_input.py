"""``gpufleet check``: bad posting options and a bad --tolerance are refused before any check runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import gpufleet.checks.multinode
import gpufleet.checks.runner
from gpufleet.cli import app
from gpufleet.domain.errors import InvalidInput

runner = CliRunner()


def _never(*_a: object, **_k: object) -> None:
    raise AssertionError("the checks ran before the options were checked")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--controller", "ctl:8470", "--token-file", "TOKEN"], "--controller"),
        (["--controller", "http://ctl:8470", "--token-file", "MISSING"], "--token-file"),
        (["--controller", "http://ctl:8470", "--token-file", "EMPTY"], "--token-file"),
        (["--level", "multinode", "--tolerance", "-0.5"], "--tolerance"),
        (["--level", "multinode", "--tolerance", "1.5"], "--tolerance"),
        (["--level", "quick", "--known-good", "n1,n2"], "--known-good"),  # only multinode has partners
    ],
)
def test_refused_before_the_checks_run(
    args: list[str], field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpufleet.checks.runner, "run_node_checks", _never)
    monkeypatch.setattr(gpufleet.checks.multinode, "run_multinode", _never)
    (tmp_path / "TOKEN").write_text("s3cret\n")
    (tmp_path / "EMPTY").write_text("\n")
    args = [str(tmp_path / a) if a in ("TOKEN", "MISSING", "EMPTY") else a for a in args]
    res = runner.invoke(app, ["check", "--device", "cpu", *args])
    assert isinstance(res.exception, InvalidInput), res.exception
    assert res.exception.field == field
