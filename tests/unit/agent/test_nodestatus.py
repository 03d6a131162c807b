"""The agent's node status file (what slurmd's HealthCheckProgram reads): judged with the catalog,
held for a while, cleared by a repair, written atomically and read back by the hook's parser."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.nodestatus import NodeStatusWriter
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.nodestatus import NodeStatus, parse_status, verdict
from gpufleet.lifecycle.config import parse_policy
from gpufleet.schedulers.slurm.hooks import healthcheck

CATALOG = load_default_catalog()

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)


class Drains:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def drain(self, node: str, reason: str) -> bool:
        """As the port: True when this call drained the node, False when it already was drained."""
        drained = node not in {n for n, _ in self.calls}
        self.calls.append((node, reason))
        return drained


def _writer(tmp_path: Path) -> tuple[NodeStatusWriter, FakeClock, Path]:
    clock = FakeClock(T0)
    path = tmp_path / "state" / "node-status.json"
    return NodeStatusWriter(path, "n1", clock, hold=timedelta(minutes=10)), clock, path


def _worst(status: NodeStatus) -> str:
    return verdict(status, CATALOG)[0]


def _ev(kind: EventKind, code: int | None = None) -> HealthEvent:
    return HealthEvent(f"e-{kind}-{code}", "n1", kind, T0, "n1-gpu0", code)


def test_a_fatal_fault_is_written_at_once_and_the_hook_drains_on_it(tmp_path: Path) -> None:
    w, clock, path = _writer(tmp_path)
    assert w.write() and _worst(parse_status(path.read_text())) == "ok"
    w.observe([_ev(EventKind.XID, 13), _ev(EventKind.XID, 45)])  # application / collateral: info only
    st = parse_status(path.read_text())
    assert st.worst == "ok" and len(st.observations) == 2 and _worst(st) == "ok"  # observed, not judged
    w.observe([_ev(EventKind.XID, 79)])
    st = parse_status(path.read_text())
    worst, reasons = verdict(st, CATALOG)
    assert worst == "fatal" and len(reasons) == 1 and "79" in reasons[0] and "n1-gpu0" in reasons[0]
    drains = Drains()
    out = healthcheck("n1", path, drains, clock.now(), timedelta(minutes=5))
    assert not out.ok and drains.calls == [("n1", f"gpufleet:healthcheck {reasons[0]}")]
    assert not list(path.parent.glob(".*.tmp")), "no temporary file left behind"


def test_faults_age_out_after_the_hold_and_a_repair_clears_them(tmp_path: Path) -> None:
    w, clock, path = _writer(tmp_path)
    w.observe([_ev(EventKind.ROW_REMAP_PENDING)])
    assert _worst(w.status()) == "degraded"
    clock.advance(601)
    assert _worst(w.status()) == "ok"
    w.observe([_ev(EventKind.XID, 48)])
    assert _worst(w.status()) == "fatal"
    w.clear("gpu_reset succeeded")
    assert _worst(parse_status(path.read_text())) == "ok"


def test_the_hook_judges_with_the_sites_policy_not_the_agent(tmp_path: Path) -> None:
    w, clock, path = _writer(tmp_path)
    w.observe([_ev(EventKind.XID, 31)])  # info in the shipped catalog
    assert healthcheck("n1", path, Drains(), clock.now(), timedelta(minutes=5)).ok
    site = parse_policy({"override": [{"kind": "xid", "code": 31, "severity": "fatal"}]}).catalog
    drains = Drains()
    assert not healthcheck("n1", path, drains, clock.now(), timedelta(minutes=5), site).ok
    assert [n for n, _ in drains.calls] == ["n1"]


def test_a_stale_file_is_reported_not_acted_on(tmp_path: Path) -> None:
    w, clock, path = _writer(tmp_path)
    w.observe([_ev(EventKind.XID, 79)])
    drains = Drains()
    out = healthcheck("n1", path, drains, clock.now() + timedelta(minutes=6), timedelta(minutes=5))
    assert out.ok and drains.calls == [] and "stale" in out.message and "is the gpufleet agent running" in out.message


def test_an_unwritable_path_is_logged_and_does_not_raise(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    w = NodeStatusWriter(tmp_path / "file" / "node-status.json", "n1", FakeClock(T0))
    assert not w.write()


def test_the_status_says_when_the_agent_last_reached_the_controller(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    path = tmp_path / "node-status.json"
    last: list[datetime | None] = [None]
    w = NodeStatusWriter(path, "n1", clock, reached=lambda: last[0])
    w.write()
    assert parse_status(path.read_text()).controller_reached is None, "never delivered"
    last[0] = T0 - timedelta(seconds=4)
    w.observe([_ev(EventKind.XID, 79)])
    assert parse_status(path.read_text()).controller_reached == T0 - timedelta(seconds=4)
