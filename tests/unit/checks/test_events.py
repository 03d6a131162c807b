from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpufleet.checks.events import events_body, result_to_event
from gpufleet.checks.model import CheckResult, Status
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, Severity
from gpufleet.domain.judgement import judge_event
from gpufleet.domain.wire import to_wire

CATALOG = load_default_catalog()

T = datetime(2026, 11, 21, 12, 0, 3, tzinfo=UTC)


def _r(status: Status, *, gpu: int | None = 3, fatal: bool = False, node: str | None = None) -> CheckResult:
    return CheckResult(
        "gemm_bf16",
        gpu,
        612.5,
        "TFLOPS",
        730.0,
        status,
        -0.161,
        "why",
        fatal=fatal,
        attrs=(("pct_of_peak", "61.9"),),
        node=node,
    )


@pytest.mark.parametrize(
    ("status", "fatal", "kind", "severity"),
    [
        (Status.PASS, False, EventKind.CHECK_PASSED, Severity.INFO),
        (Status.WARN, False, EventKind.CHECK_PASSED, Severity.INFO),
        (Status.FAIL, False, EventKind.CHECK_FAILED, Severity.DEGRADED),
        (Status.FAIL, True, EventKind.CHECK_FAILED, Severity.FATAL),
    ],
)
def test_status_maps_to_kind_and_severity(
    status: Status, fatal: bool, kind: EventKind, severity: Severity
) -> None:
    ev = result_to_event(_r(status, fatal=fatal), node="r01-n03", run_id="run1", time=T)
    assert ev.kind is kind and judge_event(CATALOG, ev).severity is severity
    # the check states only what it knows for sure (wrong answers are fatal); the catalog judges the rest
    assert ev.severity is (Severity.FATAL if fatal else None)
    assert dict(ev.attrs)["status"] == str(status)


def test_event_fields_and_wire_form() -> None:
    ev = result_to_event(_r(Status.FAIL), node="r01-n03", run_id="run1", time=T)
    assert ev.id == "check:r01-n03:run1:gemm_bf16:gpu3"
    assert ev.component == "r01-n03-gpu3" and ev.source == "check"
    wire = to_wire(ev)
    assert wire["time"] == "2026-11-21T12:00:03+00:00"
    attrs = wire["attrs"]
    assert isinstance(attrs, dict)
    assert attrs["check"] == "gemm_bf16" and attrs["gpu"] == "3" and attrs["value"] == "612.5"
    assert attrs["unit"] == "TFLOPS" and attrs["expected"] == "730" and attrs["pct_of_peak"] == "61.9"
    assert all(isinstance(v, str) for v in attrs.values())
    body = json.loads(json.dumps(events_body([ev])))
    assert body["events"][0]["kind"] == "check_failed" and body["events"][0]["severity"] is None
    assert body["events"][0]["attrs"]["rule"] == "gemm_bf16"  # a site can override one check by name


def test_node_wide_and_other_node_results() -> None:
    ev = result_to_event(_r(Status.PASS, gpu=None), node="r01-n03", run_id="r", time=T)
    assert ev.component is None and ev.id.endswith(":node") and dict(ev.attrs)["gpu"] == ""
    blamed = result_to_event(_r(Status.FAIL, gpu=None, node="r02-n07"), node="r01-n03", run_id="r", time=T)
    assert blamed.node == "r02-n07"


def test_bad_input_is_clear() -> None:
    with pytest.raises(InvalidInput) as err:
        result_to_event(_r(Status.PASS), node="n", run_id="r", time=datetime(2026, 11, 21))
    assert err.value.field == "time"
    with pytest.raises(InvalidInput) as err2:
        result_to_event(_r(Status.PASS), node="", run_id="r", time=T)
    assert err2.value.field == "node"


def test_a_failed_allocation_wide_result_blames_no_node() -> None:
    r = CheckResult(
        "multinode_allreduce", None, 40.0, "GB/s", 100.0, Status.FAIL, attrs=(("scope", "allocation"),)
    )
    ev = result_to_event(r, node="r01-n001", run_id="r", time=T)
    assert ev.kind is EventKind.CHECK_FAILED and judge_event(CATALOG, ev).severity is Severity.INFO


def test_the_sku_rides_along_for_fleet_judging() -> None:
    ev = result_to_event(_r(Status.PASS), node="r01-n03", run_id="r", time=T, sku="H100-SXM")
    assert dict(ev.attrs)["sku"] == "H100-SXM"
    assert "sku" not in dict(result_to_event(_r(Status.PASS), node="r01-n03", run_id="r", time=T).attrs)
