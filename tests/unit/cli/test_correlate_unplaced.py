"""``gpufleet correlate``: a fatal event on a component the topology lacks is a problem (exit 1), not
"nothing needs explaining"; an unplaced informational one is only a warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app

runner = CliRunner()


@pytest.fixture
def topo(tmp_path: Path) -> Path:
    path = tmp_path / "n.json"
    res = runner.invoke(app, ["topology", "generate", "nvl72", "--racks", "1", "--out", str(path)])
    assert res.exit_code == 0, res.output
    return path


def _run(topo: Path, tmp_path: Path, line: dict[str, object], *extra: str) -> tuple[int, str, str]:
    events = tmp_path / "ev.jsonl"
    events.write_text(json.dumps(line) + "\n")
    res = runner.invoke(app, ["correlate", "--topology", str(topo), "--events", str(events), *extra])
    return res.exit_code, res.stdout, res.stderr


def test_a_fatal_xid_on_an_unknown_gpu_exits_one_and_names_it(topo: Path, tmp_path: Path) -> None:
    code, out, err = _run(topo, tmp_path, {"time": "2026-11-21T12:00:00Z", "kind": "xid", "component": "zz-gpu9",
                                           "code": 79})
    assert code == 1
    assert "zz-gpu9" in err and "fatal" in err
    assert "nothing in the window needs explaining" not in out


def test_the_json_document_stays_clean_on_stdout(topo: Path, tmp_path: Path) -> None:
    code, out, err = _run(topo, tmp_path, {"time": "2026-11-21T12:00:00Z", "kind": "xid", "component": "zz-gpu9",
                                           "code": 79}, "--json")
    assert code == 1 and json.loads(out) == {"suspects": []} and "zz-gpu9" in err


def test_an_unplaced_harmless_event_only_warns(topo: Path, tmp_path: Path) -> None:
    code, _out, err = _run(topo, tmp_path, {"time": "2026-11-21T12:00:00Z", "kind": "ecc_sbe",
                                            "component": "zz-gpu9"})
    assert code == 0
    assert "not in the topology" in err
