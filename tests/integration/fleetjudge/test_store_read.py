"""``Store.check_events_since``: the judge's one read, on SQLite and on a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from gpufleet.checks.events import result_to_event
from gpufleet.checks.model import CheckResult, Status
from gpufleet.controller.store.repo import Store
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.lifecycle.plan import Plan

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)


def _check(node: str, check: str, at: datetime, value: float = 700.0, gpu: int | None = 0) -> HealthEvent:
    r = CheckResult(check, gpu, value, "TFLOPS", 700.0, Status.PASS)
    return result_to_event(r, node=node, run_id=f"run-{at.timestamp():.0f}", time=at, sku="H100-SXM")


def test_check_events_since_filters_by_time_kind_check_and_source(engine: Engine) -> None:
    store = Store(engine)
    own = HealthEvent("fleet:n1:x", "n1", EventKind.CHECK_FAILED, T0, severity=Severity.DEGRADED, source="fleet",
                      attrs=(("check", "gemm_bf16"), ("value", "1")))
    events = [
        _check("n1", "gemm_bf16", T0 - timedelta(hours=2)),  # too old
        _check("n1", "gemm_bf16", T0 + timedelta(minutes=2), value=650.5),
        _check("n2", "hbm_copy", T0 + timedelta(minutes=1), gpu=None),
        _check("n2", "pcie_h2d", T0 + timedelta(minutes=1)),  # not asked for
        HealthEvent("x1", "n2", EventKind.XID, T0, code=79, attrs=(("check", "gemm_bf16"),)),  # not a check
        own,
    ]
    store.commit(Plan(), events=events, received=T0)
    got = store.check_events_since(T0 - timedelta(hours=1), {"gemm_bf16", "hbm_copy"}, exclude_source="fleet")
    assert [(e.node, e.attrs["check"]) for e in got] == [("n2", "hbm_copy"), ("n1", "gemm_bf16")]  # oldest first
    assert got[1].attrs["value"] == "650.5" and got[1].attrs["sku"] == "H100-SXM" and got[0].attrs["gpu"] == ""
    assert got[1].time == T0 + timedelta(minutes=2) and got[1].time.tzinfo is not None
    assert got[1].id == events[1].id
    with_own = store.check_events_since(T0 - timedelta(hours=1), {"gemm_bf16"})
    assert {e.id for e in with_own} == {events[1].id, own.id}
