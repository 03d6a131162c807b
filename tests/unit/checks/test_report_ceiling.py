"""The GEMM ceiling read back from a check report: what ``Report.to_json`` writes, the goodput report reads."""

from __future__ import annotations

import json

import pytest

from gpufleet.checks.model import CheckResult, Level, Report, Status, measured_gemm_flops
from gpufleet.domain.errors import InvalidInput


def _report(*rows: tuple[str, int | None, float]) -> dict[str, object]:
    results = tuple(CheckResult(c, g, v, "TFLOPS", None, Status.PASS) for c, g, v in rows)
    doc = Report("n1", Level.QUICK, "cuda", "H100-SXM", 4, results).to_json()
    return dict(json.loads(json.dumps(doc)))  # as a file would hold it


def test_the_median_over_the_gpus_of_the_named_dtype() -> None:
    doc = _report(("gemm_bf16", 0, 700.0), ("gemm_bf16", 1, 720.0), ("gemm_bf16", 2, 650.0),
                  ("gemm_bf16", 3, 710.0), ("gemm_fp8", 0, 1400.0), ("hbm_copy", 0, 3000.0))
    assert measured_gemm_flops(doc, "bf16") == 705e12  # (700 + 710) / 2: the median of four
    assert measured_gemm_flops(doc, "fp8") == 1400e12


def test_a_node_wide_or_failed_measurement_without_a_value_is_not_a_ceiling() -> None:
    doc = _report(("gemm_bf16", 0, 0.0), ("gemm_bf16", 1, 600.0))
    assert measured_gemm_flops(doc, "bf16") == 600e12


@pytest.mark.parametrize("doc,field", [
    ([], "format"),
    ({"format": "gpufleet.check/v2", "results": []}, "format"),
    ({"format": "gpufleet.check/v1", "results": "gemm"}, "results"),
    ({"format": "gpufleet.check/v1", "results": [{"check": "gemm_fp16", "value": 1.0}]}, "results"),
])
def test_what_cannot_be_read_is_named(doc: object, field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        measured_gemm_flops(doc, "bf16")
    assert err.value.field == field
