from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.checks.baselines import UNKNOWN_SKU, load_baselines, parse_baselines
from gpufleet.checks.judge import judge_absolute
from gpufleet.checks.model import Status
from gpufleet.domain.errors import InvalidInput

GPU_SKUS = ("H100-SXM", "H200", "B200", "A100-SXM")


def test_shipped_file_covers_every_gpu_sku_with_sourced_bars() -> None:
    b = load_baselines()
    for sku in GPU_SKUS:
        checks = {e.check for e in b.entries if e.sku == sku}
        assert {
            "gemm_bf16",
            "gemm_fp16",
            "gemm_tf32",
            "hbm_copy",
            "pcie_h2d",
            "pcie_d2h",
            "nccl_allreduce",
        } <= checks
    assert "gemm_fp8" not in {e.check for e in b.entries if e.sku == "A100-SXM"}  # Ampere has no FP8
    for e in b.entries:
        assert e.source.strip(), e
        assert e.expected >= e.floor
        if e.peak is not None:
            assert e.expected <= e.peak


def test_h100_bars_match_the_published_numbers() -> None:
    b = load_baselines()
    bf16 = b.lookup("H100-SXM", "gemm_bf16")
    assert bf16 is not None and bf16.expected == 730.0 and "gpu-fryer" in bf16.source
    nccl16 = b.lookup("H100-SXM", "nccl_allreduce", 16 << 30)
    assert nccl16 is not None and nccl16.floor == 460.0 and "azurehpc" in nccl16.source.lower()
    h200 = b.lookup("H200", "nccl_allreduce", 16 << 30)
    assert h200 is not None and h200.floor == 431.0
    pcie = b.lookup("H100-SXM", "pcie_h2d")
    assert pcie is not None and pcie.floor == 48.0


@pytest.mark.parametrize(
    ("name", "sku"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM"),
        ("NVIDIA H100 PCIe", UNKNOWN_SKU),
        ("Tesla V100-SXM2-32GB", UNKNOWN_SKU),
    ],
)
def test_device_names_map_to_skus(name: str, sku: str) -> None:
    assert load_baselines().sku_for_device(name) == sku


def test_message_size_picks_the_largest_applicable_bar() -> None:
    b = load_baselines()
    assert b.lookup("H100-SXM", "nccl_allreduce", 128 << 20) is None  # smaller than any bar's message
    small = b.lookup("H100-SXM", "nccl_allreduce", 256 << 20)
    big = b.lookup("H100-SXM", "nccl_allreduce", 32 << 30)
    assert small is not None and small.floor == 150.0
    assert big is not None and big.floor == 460.0


def test_unknown_sku_or_check_has_no_bar() -> None:
    b = load_baselines()
    assert b.lookup("unknown", "gemm_bf16") is None
    assert b.lookup("H100-SXM", "no_such_check") is None
    assert b.tolerance("unknown") == b.relative_tolerance
    assert b.tolerance("cpu") > b.tolerance("H100-SXM")


def _doc(**entry: object) -> dict[str, object]:
    base: dict[str, object] = {
        "sku": "X",
        "check": "gemm_bf16",
        "unit": "TFLOPS",
        "floor": 1.0,
        "source": "s",
    }
    base.update(entry)
    return {"sku": [{"name": "X", "match": ["X"]}], "baseline": [base]}


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"expected": 0.5}, "baseline[0].expected"),
        ({"sku": "Y"}, "baseline[0].sku"),
        ({"source": ""}, "baseline[0].source"),
        ({"floor": "fast"}, "baseline[0].floor"),
        ({"min_bytes": -1}, "baseline[0].min_bytes"),
        ({"peak": 0}, "baseline[0].peak"),
    ],
)
def test_bad_entries_name_field_value_and_expectation(entry: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_baselines(_doc(**entry), "b")
    assert err.value.field == f"b.{field}"
    assert err.value.expected


def test_bad_defaults_and_unreadable_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_baselines({"defaults": {"warn_margin": 1.5}}, "b")
    assert err.value.field == "b.defaults.warn_margin" and err.value.value == 1.5
    with pytest.raises(InvalidInput) as err2:
        load_baselines(tmp_path / "missing.toml")
    assert "readable" in err2.value.expected
    bad = tmp_path / "bad.toml"
    bad.write_text("[[baseline]\n")
    with pytest.raises(InvalidInput) as err3:
        load_baselines(bad)
    assert err3.value.expected == "valid TOML"


@pytest.mark.parametrize(
    ("fixture_name", "device_name", "runs_expected"),
    [
        # 7 runs of the quick, full and burn-in levels (2026-11-26/27); this failed for gemm_fp8 in 4 of 7
        # runs against gpu-fryer's 1530 TFLOPS reference (decision 0111)
        ("h100-healthy-runs.json", "NVIDIA H100 80GB HBM3", 7),
        # 5 runs (quick x 3, full x 2) on the first H200 the project ran on (2026-11-27): its bars were
        # derived from the H100's, never seen against an H200 before
        ("h200-healthy-runs.json", "NVIDIA H200", 5),
    ],
)
def test_a_healthy_gpus_recorded_runs_pass_the_shipped_bars(
    fixture_name: str, device_name: str, runs_expected: int
) -> None:
    """Every rate a healthy GPU produced on a real GPU (tests/fixtures/checks) passes its shipped bar: a bar
    a healthy GPU misses trains operators to ignore warnings."""
    fixture = Path(__file__).parents[2] / "fixtures" / "checks" / fixture_name
    runs = json.loads(fixture.read_text())["runs"]
    assert len(runs) == runs_expected
    b = load_baselines()
    judged = 0
    for run in runs:
        assert b.sku_for_device(device_name) == run["sku"]
        for check, value in run["results"].items():
            bar = b.lookup(run["sku"], check)
            if bar is None:
                continue
            verdict = judge_absolute(value, bar, b.warn_margin)
            assert verdict.status is Status.PASS, (run["run"], check, value, verdict.reason)
            judged += 1
    # bf16, fp16, tf32, fp8, HBM copy, PCIe both ways in each run (the soak's rate has no absolute bar)
    assert judged == runs_expected * 7
