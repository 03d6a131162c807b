"""The demo end to end: real controller, simulated world; reproducible; the JSON contract for scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.demo.run import DemoOptions, run_demo
from gpufleet.domain.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[3]


def quick(seed: int) -> dict[str, object]:
    return run_demo(DemoOptions(seed=seed, duration=timedelta(hours=8), nodes=24, racks=3, headless=True,
                                serve_api=False))


def test_same_seed_same_run_and_the_loop_closes() -> None:
    a, b = quick(11), quick(11)
    a.pop("api"), b.pop("api")
    assert a == b
    assert a["nodes"] == 24
    # Faults were injected, nodes were drained, repaired and returned to service through revalidation.
    assert isinstance(a["drained"], int) and a["drained"] >= 4
    assert isinstance(a["returned_to_service"], int) and a["returned_to_service"] >= 1
    # The buggy health check flagged 60 % of the fleet: the breaker tripped instead of draining them.
    assert isinstance(a["breaker_trips"], int) and a["breaker_trips"] >= 1
    decisions = a["decisions"]
    assert isinstance(decisions, dict) and decisions.get("held", 0) >= 5
    ettr = a["ettr"]
    assert isinstance(ettr, float) and 0.0 < ettr < 1.0
    d2d = a["detect_to_drain_s"]
    assert isinstance(d2d, dict) and d2d["fatal"]["count"] >= 3


def test_different_seeds_differ() -> None:
    a, b = quick(1), quick(2)
    assert a["drained_nodes"] != b["drained_nodes"]


def test_cli_headless_json_has_the_documented_keys() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", "demo", "--headless", "--json", "--duration", "4h", "--nodes", "16",
         "--racks", "2", "--seed", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    summary = json.loads(out.stdout)
    for key in ("nodes", "interruptions", "drained", "returned_to_service", "ettr"):
        assert key in summary, key
    assert summary["nodes"] == 16
    assert summary["api"].startswith("http://127.0.0.1:")


@pytest.mark.parametrize(("kw", "field"), [({"nodes": 2}, "--nodes"), ({"racks": 0}, "--racks"),
                                           ({"duration": timedelta(minutes=5)}, "--duration")])
def test_bad_options_name_the_flag(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        run_demo(DemoOptions(headless=True, serve_api=False, **kw))  # type: ignore[arg-type]
    assert err.value.field == field


def test_cli_bad_duration_exits_2_with_the_field() -> None:
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "demo", "--headless", "--duration", "soon"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2
    assert "--duration" in out.stderr and "soon" in out.stderr
