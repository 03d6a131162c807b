"""``gpufleet topology`` and ``gpufleet correlate`` through the real Typer app."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli import app

runner = CliRunner()


def test_generate_validate_and_correlate(tmp_path: Path) -> None:
    topo = tmp_path / "hgx.json"
    res = runner.invoke(app, ["topology", "generate", "hgx", "--nodes", "64", "--out", str(topo)])
    assert res.exit_code == 0, res.output
    assert "16 leaf_switch" in res.output and "8 spine_switch" in res.output
    assert runner.invoke(app, ["topology", "validate", str(topo)]).exit_code == 0
    events = tmp_path / "ev.jsonl"
    lines = [
        {
            "time": f"2026-11-21T12:00:{10 + i:02d}Z",
            "kind": "link_down",
            "component": f"{n}-nic5",
            "link": f"{n}-nic5~leaf-su1-r5",
        }
        for i, n in enumerate(["r01-n01", "r02-n02", "r03-n03", "r07-n04"])
    ]
    lines.append({"time": "2026-11-21T12:01:00Z", "kind": "xid", "component": "r09-n01-gpu2", "code": 13})
    events.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = runner.invoke(app, ["correlate", "--topology", str(topo), "--events", str(events), "--json"])
    assert res.exit_code == 1  # an actionable suspect was found
    doc = json.loads(res.stdout)
    first = doc["suspects"][0]
    assert set(first) == {"component", "kind", "serial", "confidence", "action", "evidence"}
    assert first["component"] == "leaf-su1-r5" and first["action"] == "drain_and_replace"
    assert first["evidence"] == [1, 2, 3, 4]
    res = runner.invoke(app, ["correlate", "--topology", str(topo), "--events", str(events)])
    assert "leaf-su1-r5" in res.output and "affects 32 node(s)" in res.output


def test_bad_event_line_is_a_usage_error(tmp_path: Path) -> None:
    topo = tmp_path / "n.json"
    runner.invoke(app, ["topology", "generate", "nvl72", "--racks", "1", "--out", str(topo)])
    events = tmp_path / "bad.jsonl"
    events.write_text('{"time": "2026-11-21T12:00:00Z", "kind": "xid", "component": "r01-ct01-gpu0"}\n')
    res = runner.invoke(app, ["correlate", "--topology", str(topo), "--events", str(events)])
    assert res.exit_code != 0
    assert "line 1: code" in str(res.exception)


def test_quiet_stream_exits_zero(tmp_path: Path) -> None:
    topo = tmp_path / "n.json"
    runner.invoke(app, ["topology", "generate", "nvl72", "--racks", "1", "--out", str(topo)])
    events = tmp_path / "ok.jsonl"
    events.write_text('{"time": "2026-11-21T12:00:00Z", "kind": "xid", "component": "r01-ct01-gpu0", "code": 43}\n')
    res = runner.invoke(app, ["correlate", "--topology", str(topo), "--events", str(events), "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout) == {"suspects": []}


def test_stream_prints_verdict_changes_and_eval_scores(tmp_path: Path) -> None:
    topo = tmp_path / "n.json"
    runner.invoke(app, ["topology", "generate", "nvl72", "--racks", "1", "--out", str(topo)])
    events = tmp_path / "gpu.jsonl"
    events.write_text('{"time": "2026-11-21T12:00:00Z", "kind": "xid", "component": "r01-ct04-gpu2", "code": 79}\n')
    res = runner.invoke(app, ["correlate", "--topology", str(topo), "--events", str(events), "--stream"])
    assert "line 1: new r01-ct04-gpu2 (gpu)" in res.output
    res = runner.invoke(app, ["correlate-eval", "--kind", "hgx", "--fault", "leaf", "--seeds", "2", "--noise", "none"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["scenarios"] == 2 and doc["topology"] == "hgx"
    res = runner.invoke(app, ["correlate-eval", "--noise", "loud"])
    assert "--noise" in str(res.exception)
