"""Simulation sweeps (`gpufleet sim --sweep`): the same summaries whichever backend runs them (this
process, local worker processes, a real local Ray instance), confidence intervals, and bad input."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.domain.errors import InvalidInput
from gpufleet.sim.config import SimConfig
from gpufleet.sim.montecarlo import t_975
from gpufleet.sim.sweep import (
    ControlSpec,
    ProcessBackend,
    RayBackend,
    SerialBackend,
    Variant,
    run_sweep,
    tasks_of,
)

runner = CliRunner()
SMALL = SimConfig().with_(gpus=256, days=3.0)
VARIANTS = [Variant("base", SMALL), Variant("fixed rules", SMALL, ControlSpec("fixed")),
            Variant("async", SMALL.with_(checkpoint_persist=SMALL.checkpoint_write, checkpoint_write=1.0))]


def _per_seed(summaries: list[object]) -> list[list[tuple[int, float]]]:
    return [[(r.seed, r.report.ettr) for r in s.replicas] for s in summaries]  # type: ignore[attr-defined]


def test_serial_processes_and_ray_give_the_same_replicas_in_the_same_order() -> None:
    serial = run_sweep(VARIANTS, 4, 11, SerialBackend())
    assert [s.label for s in serial] == ["base", "fixed rules", "async"]
    assert [[seed for seed, _ in v] for v in _per_seed(serial)] == [[11, 12, 13, 14]] * 3  # common seeds
    assert len({e for v in _per_seed(serial) for _, e in v}) > 3  # the replicas really differ
    assert _per_seed(run_sweep(VARIANTS, 4, 11, ProcessBackend(2))) == _per_seed(serial)
    seen: list[int] = []
    ray = run_sweep(VARIANTS, 4, 11, RayBackend("local"), progress=seen.append)  # a real local Ray instance
    assert _per_seed(ray) == _per_seed(serial)
    assert seen == list(range(1, 13))


def test_the_confidence_interval_is_the_t_interval_of_the_replicas() -> None:
    (s,) = run_sweep([VARIANTS[0]], 6, 3, SerialBackend())
    xs = [r.report.ettr for r in s.replicas]
    half = 2.571 * statistics.stdev(xs) / math.sqrt(len(xs))  # t(0.975, 5 df) from a printed table
    lo, hi = s.ettr_ci95()
    assert lo == pytest.approx(statistics.mean(xs) - half) and hi == pytest.approx(statistics.mean(xs) + half)
    assert t_975(1) == pytest.approx(12.706) and t_975(120) == pytest.approx(1.980, abs=1e-3)
    (one,) = run_sweep([VARIANTS[0]], 1, 3, SerialBackend())
    assert one.ettr_ci95()[0] == one.ettr_ci95()[1] == one.ettr_mean()


def test_cli_sweep_json_has_every_variant_with_its_interval(tmp_path: Path) -> None:
    extra = tmp_path / "eager.toml"
    extra.write_text('[policy]\nauto_repair = true\n')
    res = runner.invoke(app, ["sim", "--gpus", "256", "--days", "2", "--replicas", "3", "--sweep", "--workers", "1",
                              "--sweep-policy", str(extra), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["sweep"]["backend"] == "serial" and doc["sweep"]["tasks"] == 3 * len(doc["variants"])
    labels = [v["label"] for v in doc["variants"]]
    assert labels[0] == "base" and labels[-1] == "policy eager.toml" and "young interval" in labels
    assert doc["variants"][-1]["policy_file"] == str(extra)
    for v in doc["variants"]:
        lo, hi = v["ettr"]["ci95"]
        assert lo <= v["ettr"]["mean"] <= hi and v["replicas"] == 3


def test_tco_per_variant_is_the_price_over_its_mean_ettr_and_the_mfu() -> None:
    res = runner.invoke(app, ["sim", "--gpus", "256", "--days", "2", "--replicas", "3", "--sweep", "--workers", "1",
                              "--price-per-gpu-hour", "2.5", "--mfu", "0.4", "--json"])
    assert res.exit_code == 0, res.output
    for v in json.loads(res.stdout)["variants"]:
        t = v["tco"]
        assert t["per_useful_gpu_hour"] == pytest.approx(2.5 / (v["ettr"]["mean"] * 0.4))
        assert t["gpu_hours"] == pytest.approx(256 * 2 * 24)


@pytest.mark.parametrize(("argv", "field"), [
    (["--sweep", "--workers", "1", "--sweep-policy", "/no/such.toml"], "--sweep-policy"),
    (["--workers", "2"], "--sweep"),
    (["--ray", "local"], "--sweep"),
    (["--sweep", "--workers", "1", "--mfu", "0.5"], "--mfu"),
    (["--sweep", "--workers", "1", "--price-per-gpu-hour", "0"], "price_per_gpu_hour"),
])
def test_bad_sweep_options_name_the_field(argv: list[str], field: str) -> None:
    """Through the console entry point, as a user runs it: exit 2 and the field named on stderr."""
    res = subprocess.run([sys.executable, "-m", "gpufleet.cli", "sim", "--gpus", "256", "--days", "1",
                          "--replicas", "2", *argv], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and f"error: {field}" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    with pytest.raises(InvalidInput) as err:
        ControlSpec("random")
    assert err.value.field == "control"
    with pytest.raises(InvalidInput):
        tasks_of(VARIANTS, 0, 1)
    with pytest.raises(InvalidInput):
        ProcessBackend(0)
