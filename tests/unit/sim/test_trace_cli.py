"""Trace parsing and replay, and the ``gpufleet sim`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.domain.errors import InvalidInput
from gpufleet.sim.config import SimConfig
from gpufleet.sim.control import FixedControl
from gpufleet.sim.engine import run_replica
from gpufleet.sim.repair import default_repair, exponential_cdf, ks_distance
from gpufleet.sim.trace import Effect, classify, parse_trace
from tests.conftest import require_service

SHARED = Path(__file__).resolve().parents[3].parent / "shared/data/infinitehbd-trace/fault_trace.json"


def ev(node: str, day: float, kind: str, level: str, cls: str, desc: str) -> dict[str, object]:
    return {"node_id": node, "event_time": day, "event_type": kind,
            "fault_type": {"Level": level, "Class": cls, "Desc": desc}}


def fault(node: str, start: float, end: float, level: str, cls: str, desc: str) -> list[dict[str, object]]:
    return [ev(node, start, "fault_start", level, cls, desc), ev(node, end, "fault_end", level, cls, desc)]


def test_classification_of_trace_classes() -> None:
    assert classify("Hardware Failure", "GPU", "GPU DBE(Double Bit ECC) > Threshold") == ("gpu", Effect.INTERRUPT)
    assert classify("Hardware Failure", "GPU", "GPU Temperature High") == ("gpu", Effect.DEGRADED)
    assert classify("Hardware Failure", "Fan", "Speed Critical (Sensor)")[1] is Effect.DEGRADED
    assert classify("Other Failure", "Stress Test Failure", "Unknown Error")[1] is Effect.BURN_IN
    assert classify("Other Failure", "Training Task Troubleshooting", "Suspect Machine Offline")[1] is Effect.INTERRUPT


def test_parse_pairs_starts_and_ends() -> None:
    doc = (fault("a", 1.0, 1.5, "Hardware Failure", "GPU", "GPU Lost")
           + fault("b", 2.0, 4.0, "Other Failure", "Stress Test Failure", "Unknown Error"))
    doc.sort(key=lambda e: e["event_time"])  # type: ignore[arg-type, return-value]
    t = parse_trace(doc, nodes=10)
    assert [(f.node, f.duration / 86400, f.effect) for f in t.faults] == [
        ("a", 0.5, Effect.INTERRUPT), ("b", 2.0, Effect.BURN_IN)]
    assert t.rate_per_node_day() == pytest.approx(1 / (10 * 4.0))


def test_bad_trace_events_name_the_field() -> None:
    with pytest.raises(InvalidInput) as err:
        parse_trace([{"node_id": "a", "event_time": 1, "event_type": "fault_begin",
                      "fault_type": {"Level": "x", "Class": "y", "Desc": "z"}}])
    assert err.value.field == "trace[0].event_type"
    with pytest.raises(InvalidInput):
        parse_trace({"not": "a list"})


def test_replay_applies_each_effect() -> None:
    doc = (fault("a", 1.0, 1.5, "Hardware Failure", "GPU", "GPU Lost")
           + fault("b", 2.0, 2.5, "Hardware Failure", "Fan", "Speed Critical (Sensor)")
           + fault("c", 3.0, 3.5, "Other Failure", "Stress Test Failure", "Unknown Error"))
    doc.sort(key=lambda e: e["event_time"])  # type: ignore[arg-type, return-value]
    trace = parse_trace(doc, nodes=3)
    cfg = SimConfig(gpus=24, days=5, categories=(), planned_per_node_day=0.0, checkpoint_interval=600.0,
                    checkpoint_write=10.0)
    r = run_replica(cfg, 0, control=FixedControl(), trace=trace).report
    # All three nodes are in the job: the GPU fault interrupts, the fan is drained at a checkpoint,
    # the stress-test finding (a node out of service for testing) does not touch the job.
    assert r.interruptions.unexpected == 1
    assert r.interruptions.planned == 1
    assert dict(r.interruptions.by_cause) == {"gpu": 1, "degraded:cooling": 1}


def test_shipped_repair_distribution_fits_better_than_an_exponential_guess() -> None:
    rep = default_repair()
    assert len(rep.values) == 368
    assert ks_distance(rep.values, exponential_cdf(rep.mean)) > 0.25
    assert ks_distance(rep.values, exponential_cdf(2 * 86400.0)) > 0.25


def test_infinitehbd_trace_counts() -> None:
    from gpufleet.sim.trace import load_trace

    require_service(SHARED.exists(), f"the shared InfiniteHBD trace at {SHARED}")
    t = load_trace(SHARED)
    assert t.nodes == 400
    assert len(t.faults) == 584
    n_int = sum(1 for f in t.faults if f.effect is Effect.INTERRUPT)
    assert n_int == 368
    assert t.rate_per_node_day() == pytest.approx(368 / (400 * 348.9798), rel=1e-3)


runner = CliRunner()


def test_cli_json_has_the_documented_keys() -> None:
    res = runner.invoke(app, ["sim", "--gpus", "256", "--days", "5", "--replicas", "3", "--seed", "4",
                              "--checkpoint-interval", "20m", "--checkpoint-write", "30s", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for key in ("gpus", "days", "interruptions", "ettr", "mttf_hours", "badput"):
        assert key in doc
    assert set(doc["interruptions"]) >= {"total", "planned", "unexpected", "by_cause"}
    assert set(doc["ettr"]) >= {"mean", "p5", "p95"}
    assert doc["gpus"] == 256 and doc["replicas"] == 3
    assert doc["policy"]["checkpoint_interval_s"] == 1200
    assert 0.0 <= doc["ettr"]["p5"] <= doc["ettr"]["mean"] <= doc["ettr"]["p95"] <= 1.0


def test_cli_node_failure_rate_replaces_the_category_model() -> None:
    res = runner.invoke(app, ["sim", "--gpus", "800", "--days", "10", "--replicas", "2", "--json",
                              "--node-failure-rate", "0.01", "--planned-rate", "0"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert set(doc["interruptions"]["by_cause"]) <= {"node_failure"}
    assert doc["theory"]["mtbf_hours"] == pytest.approx(24 / (100 * 0.01))


def test_cli_rejects_bad_durations_and_scenarios() -> None:
    from gpufleet.cli import main

    for args in (["sim", "--checkpoint-write", "ten seconds"], ["sim", "--scenario", "gpt-5"]):
        with pytest.raises(SystemExit) as exc:
            import sys
            old = sys.argv
            sys.argv = ["gpufleet", *args]
            try:
                main()
            finally:
                sys.argv = old
        assert exc.value.code == 2


def test_cli_policy_file_reaches_the_lifecycle_engine(tmp_path: Path) -> None:
    # In dry-run the production policy records decisions but acts on none: no node is ever drained.
    policy = tmp_path / "policy.toml"
    policy.write_text("[policy]\ndry_run = true\n")
    args = ["sim", "--gpus", "512", "--days", "10", "--replicas", "2", "--json", "--node-failure-rate", "0.02"]
    dry = json.loads(runner.invoke(app, [*args, "--policy", str(policy)]).output)
    live = json.loads(runner.invoke(app, args).output)
    assert live["spares"]["peak_in_repair_max"] > 0
    assert dry["spares"]["peak_in_repair_max"] == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nevidence_window = 5\n[breaker]\nmax_unavailable_fleet = 3\n")
    res = runner.invoke(app, [*args, "--policy", str(bad)])
    assert res.exit_code != 0


def test_cli_report_writes_the_page_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "rep"
    res = runner.invoke(app, ["sim", "--gpus", "128", "--days", "3", "--replicas", "2", "--json",
                              "--control", "fixed", "--report", str(out)])
    assert res.exit_code == 0, res.output
    page = (out / "index.html").read_text()
    for png in ("ettr.png", "badput.png", "interval.png"):
        assert (out / png).stat().st_size > 1000
        assert png in page
    assert "daly interval" in page and "hot spares" in page
    assert json.loads((out / "summary.json").read_text())[0]["label"] == "base"


def test_trace_nodes_without_a_trace_is_named_not_ignored() -> None:
    res = runner.invoke(app, ["sim", "--gpus", "64", "--days", "1", "--replicas", "1", "--trace-nodes", "400"])
    assert isinstance(res.exception, InvalidInput) and res.exception.field == "--trace-nodes", res.output


@pytest.mark.parametrize("verbose", [True, False])
def test_verbose_logs_every_lifecycle_transition_and_quiet_logs_none(verbose: bool) -> None:
    """As a user runs it (its own process: the root logger as the command leaves it)."""
    import subprocess
    import sys

    args = ["sim", "--gpus", "64", "--days", "5", "--replicas", "1", *(["--verbose"] if verbose else [])]
    res = subprocess.run([sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    moves = [ln for ln in res.stderr.splitlines() if "gpufleet.lifecycle" in ln and " -> " in ln]
    if verbose:
        assert any("ready -> in_service" in m for m in moves), res.stderr[-2000:]
    else:
        assert moves == []


def _small_trace(tmp_path: Path) -> Path:
    doc = (fault("a", 1.0, 1.5, "Hardware Failure", "GPU", "GPU Lost")
           + fault("b", 2.0, 2.5, "Hardware Failure", "GPU", "GPU DBE(Double Bit ECC) > Threshold"))
    doc.sort(key=lambda e: e["event_time"])  # type: ignore[arg-type, return-value]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    return path


def test_trace_job_is_the_servers_but_the_spares_in_replay_synthetic_and_header(tmp_path: Path) -> None:
    """With --hot-spares the replayed job runs on the trace's other servers; the synthetic run it is
    compared with, the JSON and the table's title say the same job (they said the whole trace)."""
    args = ["sim", "--trace", str(_small_trace(tmp_path)), "--trace-nodes", "10", "--hot-spares", "2",
            "--replicas", "1"]
    doc = json.loads(runner.invoke(app, [*args, "--json"]).output)
    for run in (doc, doc["synthetic"]):
        assert (run["nodes"], run["gpus"], run["policy"]["hot_spares"]) == (8, 64, 2)
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "64 GPUs (8 nodes + 2 hot spares)" in " ".join(table.output.split())
    refused = runner.invoke(app, [*args[:-2], "--hot-spares", "10"])
    assert isinstance(refused.exception, InvalidInput) and refused.exception.field == "--hot-spares", refused.output
    assert "fewer than the trace's 10 servers" in str(refused.exception)
