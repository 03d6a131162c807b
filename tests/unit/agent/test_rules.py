from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.agent.collectors.host import EdacReading, HostReading, MountReading
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.devices.port import FastReading, NvLinkReading, SlowReading, ThrottleReason, XidEvent
from gpufleet.agent.rules import PassiveChecks, Thresholds
from gpufleet.agent.weaklinks import WeakLinks
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import judge_event

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"
T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


CATALOG = load_default_catalog()


def sev(ev: HealthEvent) -> Severity:
    """The controller's judgement of an observation (the agent states no severity of its own)."""
    assert ev.severity is None and ev.attr("rule"), ev
    return judge_event(CATALOG, ev).severity


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def slow(**kw: object) -> SlowReading:
    base: dict[str, object] = dict(
        index=0,
        ecc_sbe_aggregate=0,
        ecc_dbe_aggregate=0,
        remap_pending=False,
        remap_failure=False,
        pcie_gen=5,
        pcie_gen_max=5,
        pcie_width=16,
        pcie_width_max=16,
        pcie_replay=0,
    )
    base.update(kw)
    return SlowReading(**base)  # type: ignore[arg-type]


def test_row_remap_failure_is_fatal_once() -> None:
    c = PassiveChecks("n1")
    assert c.on_slow(slow(), at(0)) == []
    [ev] = c.on_slow(slow(remap_failure=True, remap_uncorrectable=512), at(30))
    assert (ev.kind, sev(ev), ev.component, ev.node) == (
        EventKind.ROW_REMAP_FAILURE,
        Severity.FATAL,
        "n1-gpu0",
        "n1",
    )
    assert c.on_slow(slow(remap_failure=True, remap_uncorrectable=512), at(60)) == []


def test_dbe_growth_is_fatal_and_pending_remap_degraded() -> None:
    c = PassiveChecks("n1")
    c.on_slow(slow(ecc_dbe_aggregate=1), at(0))
    evs = c.on_slow(slow(ecc_dbe_aggregate=3, remap_pending=True, remap_uncorrectable=2), at(30))
    kinds = {e.kind: e for e in evs}
    assert sev(kinds[EventKind.ECC_DBE]) is Severity.FATAL
    assert "2 new uncorrectable" in kinds[EventKind.ECC_DBE].message
    assert sev(kinds[EventKind.ROW_REMAP_PENDING]) is Severity.DEGRADED


def test_sbe_needs_threshold_within_interval() -> None:
    c = PassiveChecks("n1", Thresholds(sbe_increase=100))
    c.on_slow(slow(ecc_sbe_aggregate=10), at(0))
    assert c.on_slow(slow(ecc_sbe_aggregate=109), at(30)) == []
    [ev] = c.on_slow(slow(ecc_sbe_aggregate=209), at(60))
    assert ev.kind is EventKind.ECC_SBE and sev(ev) is Severity.DEGRADED


def test_counter_reset_rebaselines_without_event() -> None:
    c = PassiveChecks("n1", Thresholds(sbe_increase=1))
    c.on_slow(slow(ecc_sbe_aggregate=500), at(0))
    assert c.on_slow(slow(ecc_sbe_aggregate=0), at(30)) == []  # driver reload
    assert len(c.on_slow(slow(ecc_sbe_aggregate=2), at(60))) == 1


def test_pcie_width_below_max_is_degraded_link_error() -> None:
    c = PassiveChecks("n1")
    [ev] = c.on_slow(slow(pcie_width=8), at(0), util=10.0)
    assert ev.kind is EventKind.LINK_ERROR and sev(ev) is Severity.DEGRADED
    assert ev.link == "n1-gpu0~pcie" and "x8" in ev.message and "x16" in ev.message


def test_pcie_gen_only_counts_under_load() -> None:
    c = PassiveChecks("n1", Thresholds(pcie_gen_min_util=50))
    assert c.on_slow(slow(pcie_gen=1), at(0), util=0.0) == []  # idle downtraining is normal
    [ev] = c.on_slow(slow(pcie_gen=3), at(30), util=95.0)
    assert "gen 3" in ev.message


def test_pcie_replay_burst() -> None:
    c = PassiveChecks("n1", Thresholds(pcie_replay_increase=50))
    c.on_slow(slow(pcie_replay=10), at(0))
    [ev] = c.on_slow(slow(pcie_replay=70), at(30))
    assert ev.kind is EventKind.LINK_ERROR and dict(ev.attrs)["rule"] == "pcie_replay"


def test_nvlink_down_after_up_and_crc_burst() -> None:
    c = PassiveChecks("n1", Thresholds(nvlink_error_increase=10))
    up = tuple(NvLinkReading(i, True, 0, 0, 0, 0) for i in range(4))
    assert c.on_slow(slow(nvlinks=up), at(0)) == []
    links = list(up)
    links[2] = NvLinkReading(2, False, 0, 0, 0, 0)
    links[3] = NvLinkReading(3, True, 9, 2, 0, 0)
    evs = c.on_slow(slow(nvlinks=tuple(links)), at(30))
    assert [(e.kind, e.link) for e in evs] == [
        (EventKind.LINK_DOWN, "n1-gpu0~nvlink2"),
        (EventKind.LINK_ERROR, "n1-gpu0~nvlink3"),
    ]
    assert sev(evs[0]) is Severity.FATAL
    assert c.on_slow(slow(nvlinks=tuple(links)), at(60)) == []


def _nvlink_errors(c: PassiveChecks, s: float, errors: int) -> list[HealthEvent]:
    """One slow read of GPU 0 whose NVLink 3 has ``errors`` CRC flit errors in all."""
    return c.on_slow(slow(nvlinks=(NvLinkReading(3, True, errors, 0, 0, 0),)), at(s))


def test_nvlink_errors_below_the_limit_are_weak_reports_one_per_link_a_minute() -> None:
    c = PassiveChecks("n1", Thresholds(nvlink_error_increase=100))
    assert _nvlink_errors(c, 0, 7) == []  # the baseline: errors counted before the agent started
    [ev] = _nvlink_errors(c, 10, 8)
    assert (ev.kind, ev.link, ev.attr("rule"), ev.attr("nvlink"), ev.attr("errors")) == (
        EventKind.LINK_ERROR, "n1-gpu0~nvlink3", "nvlink_error_seen", "3", "1")
    assert sev(ev) is Severity.INFO  # no per-node policy acts on one: the correlator's witness
    assert _nvlink_errors(c, 40, 10) == []  # within the minute: carried
    assert _nvlink_errors(c, 60, 10) == []  # nothing new
    [again] = _nvlink_errors(c, 71, 11)
    assert again.attr("errors") == "3" and again.id != ev.id  # the carried 2 and the new one
    [strong] = _nvlink_errors(c, 200, 411)  # past the limit: the rule's event, not a weak one too
    assert strong.attr("rule") == "nvlink_errors" and sev(strong) is Severity.DEGRADED


def test_a_port_over_its_limit_sends_no_weak_report_until_it_is_back_under(tmp_path: Path) -> None:
    """Over the rate limit the rule's event says it once; the errors that keep coming are not weak reports
    (at the window's close or between two), until the rate is back under the limit."""
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy", root)
    col, f = InfinibandCollector(root), root / "mlx5_7/ports/1/counters/symbol_error"
    c = PassiveChecks("n1", Thresholds(ib_window_s=60, ib_symbol_error_per_min=10))

    def read(s: float, value: int) -> list[tuple[str, str]]:
        f.write_text(f"{value}\n")
        return [(e.attr("rule"), e.attr("errors")) for p in col.read() for e in c.on_ib(p, at(s), s)
                if e.component == "n1-nic7"]

    assert read(0, 0) == []
    assert read(30, 1000) == [("ib_symbol_error_seen", "1000")]  # no rate yet (the window has not closed)
    assert read(60, 2000) == [("ib_symbol_error", "")]  # 2000 a minute: the rule, once
    assert read(90, 3000) == [] and read(120, 4000) == []  # still over, between and at a window's close
    assert read(180, 4001) == [("ib_symbol_error_seen", "1")]  # back under at the close: weak reports again
    assert read(241, 4003) == [("ib_symbol_error_seen", "2")]  # (none of the errors counted while over)


def test_a_weak_report_after_a_counter_reset_is_a_new_event() -> None:
    """After a GPU reset the counters start from 0 again: the same total on the same link must not reuse
    the first report's id (the controller would refuse the batch as a reused id with other content)."""
    c = PassiveChecks("n1")
    _nvlink_errors(c, 0, 0)
    [first] = _nvlink_errors(c, 30, 1)
    assert _nvlink_errors(c, 100, 0) == []  # the reset: a new baseline
    [again] = _nvlink_errors(c, 200, 1)
    assert again.attr("errors") == "1" and again.id != first.id


def test_weak_link_reports_can_be_turned_off() -> None:
    c = PassiveChecks("n1", Thresholds(weak_link_events=False))
    assert _nvlink_errors(c, 0, 0) == [] and _nvlink_errors(c, 100, 5) == []


@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 200)), max_size=60))
def test_weak_reports_lose_no_error_and_keep_their_interval(steps: list[tuple[int, float]]) -> None:
    """Every error is in a report or still carried; no link reports twice within the interval."""
    weak = WeakLinks(60.0)
    t, sent, times = 0.0, 0, []
    for errors, gap in steps:
        t += gap
        n = weak.seen("n1-gpu0:nvlink3", errors, t)
        if n is not None:
            sent += n
            times.append(t)
    assert sent + weak.carried("n1-gpu0:nvlink3") == sum(e for e, _ in steps)
    assert all(b - a >= 60.0 for a, b in pairwise(times))


def test_nvlink_never_up_is_not_reported() -> None:
    c = PassiveChecks("n1")
    assert c.on_slow(slow(nvlinks=(NvLinkReading(0, False),)), at(0)) == []


def test_thermal_with_hysteresis() -> None:
    c = PassiveChecks("n1", Thresholds(thermal_c=87, thermal_clear_c=82))
    assert c.on_fast(FastReading(0, temp_gpu_c=80.0, throttle_reasons=0), at(0)) == []
    [ev] = c.on_fast(FastReading(0, temp_gpu_c=88.0, throttle_reasons=0), at(1))
    assert ev.kind is EventKind.THERMAL and sev(ev) is Severity.DEGRADED
    assert c.on_fast(FastReading(0, temp_gpu_c=85.0, throttle_reasons=0), at(2)) == []  # not yet cleared
    assert c.on_fast(FastReading(0, temp_gpu_c=88.0, throttle_reasons=0), at(3)) == []
    assert c.on_fast(FastReading(0, temp_gpu_c=80.0, throttle_reasons=0), at(4)) == []  # cleared
    assert len(c.on_fast(FastReading(0, temp_gpu_c=89.0, throttle_reasons=0), at(5))) == 1


def test_thermal_slowdown_bit_alone_triggers() -> None:
    c = PassiveChecks("n1")
    [ev] = c.on_fast(FastReading(0, temp_gpu_c=70.0, throttle_reasons=int(ThrottleReason.HW_THERMAL_SLOWDOWN)), at(0))
    assert "slowdown" in ev.message


def test_gpu_lost_is_fatal_once() -> None:
    c = PassiveChecks("n1")
    [ev] = c.on_fast(FastReading(5, lost=True), at(0))
    assert (ev.kind, sev(ev), ev.component) == (EventKind.GPU_LOST, Severity.FATAL, "n1-gpu5")
    assert c.on_fast(FastReading(5, lost=True), at(1)) == []
    assert c.on_slow(SlowReading(5, lost=True), at(1)) == []


def test_xid_event_carries_code_and_no_severity() -> None:
    ev = PassiveChecks("n1").on_xid(XidEvent(3, 79, at(7), "fell off"))
    assert (ev.kind, ev.code, ev.component, ev.severity, ev.time, ev.source) == (
        EventKind.XID,
        79,
        "n1-gpu3",
        None,
        at(7),
        "nvml",
    )
    assert ev.attr("gpu") == "3" and not ev.attr("rule")  # an XID is judged by its code


def test_ib_port_down_flap_rate_and_symbol_errors(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy", root)
    col = InfinibandCollector(root)
    c = PassiveChecks("n1", Thresholds(ib_window_s=60, ib_symbol_error_per_min=10, ib_expected_rate_gbps=400))
    assert [e for p in col.read() for e in c.on_ib(p, at(0), 0.0)] == []
    port = root / "mlx5_4/ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("2: Polling\n")
    (port / "counters/link_downed").write_text("1\n")
    (root / "mlx5_1/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    (root / "mlx5_7/ports/1/counters/symbol_error").write_text("5\n")  # 5/min: under the limit
    evs = [e for p in col.read() for e in c.on_ib(p, at(30), 30.0)]
    got = sorted((e.kind.value, e.component, e.attr("rule")) for e in evs)
    assert got == [("link_down", "n1-nic4", "ib_down"), ("link_error", "n1-nic1", "ib_rate"),
                   ("link_error", "n1-nic7", "ib_symbol_error_seen"), ("link_flap", "n1-nic4", "ib_flap")]
    [weak] = [e for e in evs if e.component == "n1-nic7"]  # under the limit: a weak report, judged info
    assert sev(weak) is Severity.INFO and weak.attr("errors") == "5" and weak.attr("device") == "mlx5_7"
    (root / "mlx5_7/ports/1/counters/symbol_error").write_text("40\n")
    evs = [e for p in col.read() for e in c.on_ib(p, at(60), 60.0)]
    [sym] = [e for e in evs if e.component == "n1-nic7"]  # the rate event, not a weak report as well
    assert sym.attr("rule") == "ib_symbol_error" and sev(sym) is Severity.DEGRADED and "40.0/min" in sym.message


def test_ib_degraded_fixture_first_read_reports_only_rate() -> None:
    """Counters already high at start are a baseline (history), not a new event; the slow rate is current."""
    c = PassiveChecks("n1", Thresholds(ib_expected_rate_gbps=400))
    evs = [e for p in InfinibandCollector(FIX / "h100-degraded").read() for e in c.on_ib(p, at(0), 0.0)]
    assert [(e.component, dict(e.attrs)["rule"]) for e in evs] == [("n1-nic5", "ib_rate")]


def test_host_edac_and_mounts() -> None:
    c = PassiveChecks("n1", Thresholds(mount_min_free_fraction=0.1))
    ok = HostReading((EdacReading("mc0", 3, 0),), (MountReading("data", "/data", True, 500, 1000),))
    assert c.on_host(ok, at(0)) == []
    bad = HostReading(
        (EdacReading("mc0", 9, 1),),
        (MountReading("data", "/data", True, 50, 1000), MountReading("checkpoint", "/ckpt", False)),
    )
    evs = c.on_host(bad, at(30))
    msgs = sorted((sev(e).value, dict(e.attrs)["check"]) for e in evs)
    assert msgs == [("degraded", "disk_free"), ("fatal", "edac"), ("fatal", "mount")]


@given(st.lists(st.booleans(), max_size=40))
def test_edge_trigger_counts_rising_edges(flags: list[bool]) -> None:
    c = PassiveChecks("n1")
    n = sum(len(c.on_slow(slow(remap_pending=f), at(i))) for i, f in enumerate(flags))
    rising = sum(1 for i, f in enumerate(flags) if f and (i == 0 or not flags[i - 1]))
    assert n == rising


@given(st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=30))
def test_dbe_events_match_growth(steps: list[int]) -> None:
    c = PassiveChecks("n1")
    total, events = 0, 0
    c.on_slow(slow(ecc_dbe_aggregate=0), at(0))
    for i, s in enumerate(steps):
        total += s
        events += sum(e.kind is EventKind.ECC_DBE for e in c.on_slow(slow(ecc_dbe_aggregate=total), at(i + 1)))
    assert events == sum(1 for s in steps if s > 0)



# --- event ids: two different events never share one ---------------------------------------------------
# A counter starts again from 0 after a reset (GPU reset, driver reload, reboot, HCA reset, a replaced
# board, ``nvidia-smi -p``), so its totals repeat; an edge goes off and on again; a restarted agent sees a
# condition that still holds as new. The controller refuses a reused (node, id) with another payload (409)
# and the agent drops it: an id that repeats loses an event.
def _ib_checks(tmp_path: Path) -> tuple[PassiveChecks, InfinibandCollector, Path]:
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy", root)
    th = Thresholds(ib_window_s=60, ib_symbol_error_per_min=10, ib_rcv_error_per_min=10, weak_link_events=False)
    return PassiveChecks("n1", th), InfinibandCollector(root), root / "mlx5_7/ports/1/counters"


def _ib_rule(c: PassiveChecks, col: InfinibandCollector, counters: Path, s: float, rule: str,
             **values: int) -> list[HealthEvent]:
    """One InfiniBand read at ``s`` with ``values`` written to mlx5_7 port 1's counters; the events of ``rule``."""
    for name, v in values.items():
        (counters / name).write_text(f"{v}\n")
    return [e for p in col.read() for e in c.on_ib(p, at(s), s) if e.attr("rule") == rule]


@pytest.mark.parametrize(("field", "rule", "total"), [
    ("ecc_dbe_aggregate", "dbe_increase", 1),
    ("ecc_sbe_aggregate", "sbe_burst", 150),
    ("pcie_replay", "pcie_replay", 150),
])
def test_a_gpu_counter_back_at_its_total_after_a_reset_is_a_new_event(field: str, rule: str, total: int) -> None:
    c = PassiveChecks("n1")

    def read(s: float, value: int) -> list[HealthEvent]:
        return [e for e in c.on_slow(slow(**{field: value}), at(s)) if e.attr("rule") == rule]

    assert read(0, 0) == []
    [first] = read(30, total)
    assert read(60, 0) == []  # the reset: a new baseline
    [again] = read(90, total)
    assert again.id != first.id and again.time != first.time


def test_nvlink_errors_back_at_their_total_after_a_reset_are_a_new_event() -> None:
    c = PassiveChecks("n1", Thresholds(nvlink_error_increase=100))
    assert _nvlink_errors(c, 0, 0) == []
    [first] = _nvlink_errors(c, 30, 150)
    assert _nvlink_errors(c, 60, 0) == []
    [again] = _nvlink_errors(c, 90, 150)
    assert (first.attr("rule"), again.attr("rule")) == ("nvlink_errors", "nvlink_errors") and again.id != first.id


def test_an_ib_link_downed_count_back_at_its_total_after_an_hca_reset_is_a_new_flap(tmp_path: Path) -> None:
    c, col, counters = _ib_checks(tmp_path)
    assert _ib_rule(c, col, counters, 0, "ib_flap", link_downed=0) == []
    [first] = _ib_rule(c, col, counters, 30, "ib_flap", link_downed=1)
    assert _ib_rule(c, col, counters, 60, "ib_flap", link_downed=0) == []
    [again] = _ib_rule(c, col, counters, 90, "ib_flap", link_downed=1)
    assert again.id != first.id


@pytest.mark.parametrize("counter", ["symbol_error", "port_rcv_errors"])
def test_an_ib_error_rate_back_at_its_total_after_an_hca_reset_is_a_new_event(tmp_path: Path, counter: str) -> None:
    c, col, counters = _ib_checks(tmp_path)
    rule = f"ib_{counter}"
    assert _ib_rule(c, col, counters, 0, rule, **{counter: 0}) == []
    [first] = _ib_rule(c, col, counters, 60, rule, **{counter: 1000})  # 1000 a minute
    assert _ib_rule(c, col, counters, 120, rule, **{counter: 1000}) == []  # none in the next window: re-armed
    assert _ib_rule(c, col, counters, 150, rule, **{counter: 0}) == []  # the HCA reset
    [again] = _ib_rule(c, col, counters, 210, rule, **{counter: 1000})
    assert again.id != first.id


def test_a_host_memory_error_count_back_at_its_total_after_a_reboot_is_a_new_event() -> None:
    c = PassiveChecks("n1")

    def read(s: float, ue: int) -> list[HealthEvent]:
        return c.on_host(HostReading((EdacReading("mc0", 0, ue),), ()), at(s))

    assert read(0, 0) == []
    [first] = read(30, 1)
    assert read(60, 0) == []
    [again] = read(90, 1)
    assert again.attr("check") == "edac" and again.id != first.id


_AT_A_COUNT = {  # edge rules whose old ids were keyed by a count that stays the same while they hold
    "remap_failure": dict(remap_failure=True, remap_uncorrectable=512),
    "remap_pending": dict(remap_pending=True, remap_uncorrectable=2),
    "page_retirement_pending": dict(retired_pages_pending=True, retired_pages_sbe=3),
    "retired_pages_max": dict(retired_pages_sbe=20, retired_pages_dbe=40),
}


@pytest.mark.parametrize("rule", sorted(_AT_A_COUNT))
def test_an_edge_at_the_same_count_that_goes_off_and_on_again_is_a_new_event(rule: str) -> None:
    c = PassiveChecks("n1")

    def read(s: float, on: bool) -> list[HealthEvent]:
        return [e for e in c.on_slow(slow(**(_AT_A_COUNT[rule] if on else {})), at(s)) if e.attr("rule") == rule]

    [first] = read(0, True)
    assert read(30, False) == []  # a GPU reset applied the remap, a read that failed, a replaced board ...
    [again] = read(60, True)
    assert again.id != first.id


@pytest.mark.parametrize("rule", sorted(_AT_A_COUNT))
def test_an_edge_a_restarted_agent_sees_again_is_a_new_event(rule: str) -> None:
    """A restarted agent reports a condition that still holds (its edges start unarmed): a new observation,
    at another time, which the controller must not refuse as a reuse of the first one's id."""
    [first] = [e for e in PassiveChecks("n1").on_slow(slow(**_AT_A_COUNT[rule]), at(0)) if e.attr("rule") == rule]
    [again] = [e for e in PassiveChecks("n1").on_slow(slow(**_AT_A_COUNT[rule]), at(45)) if e.attr("rule") == rule]
    assert again.id != first.id


def test_an_edge_that_goes_off_and_on_again_within_one_second_is_a_new_event() -> None:
    """A cadence under a second (``fast_s = 0.3``) sees an edge go off and on again within one second."""
    c = PassiveChecks("n1", Thresholds(thermal_c=87, thermal_clear_c=82))
    [first] = c.on_fast(FastReading(0, temp_gpu_c=88.0, throttle_reasons=0), at(0.1))
    assert c.on_fast(FastReading(0, temp_gpu_c=80.0, throttle_reasons=0), at(0.4)) == []
    [again] = c.on_fast(FastReading(0, temp_gpu_c=88.0, throttle_reasons=0), at(0.7))
    [lost] = c.on_fast(FastReading(1, lost=True), at(0.1))
    assert c.on_fast(FastReading(1), at(0.4)) == []
    [lost_again] = c.on_fast(FastReading(1, lost=True), at(0.7))
    assert again.id != first.id and lost_again.id != lost.id


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 2), st.integers(0, 150),
                          st.integers(0, 150), st.booleans(), st.booleans(), st.floats(0.001, 90.0)),
                max_size=40))
def test_no_two_different_events_share_an_id(
        steps: list[tuple[bool, int, int, int, int, bool, bool, float]]) -> None:
    """Any readings, counters that fall back (resets), edges that flap, agent restarts: an id names one event."""
    th = Thresholds(sbe_increase=1, pcie_replay_increase=50, nvlink_error_increase=100, retired_pages_max=2)
    c, t = PassiveChecks("n1", th), 0.0
    named: dict[str, HealthEvent] = {}
    for restart, sbe, dbe, replay, nvlink, pending, failure, gap in steps:
        t += gap
        if restart:
            c = PassiveChecks("n1", th)
        r = slow(ecc_sbe_aggregate=sbe, ecc_dbe_aggregate=dbe, pcie_replay=replay, remap_pending=pending,
                 remap_failure=failure, retired_pages_pending=pending, retired_pages_dbe=dbe,
                 nvlinks=(NvLinkReading(3, True, nvlink, 0, 0, 0),))
        for e in c.on_slow(r, at(t)):
            assert named.setdefault(e.id, e) == e, f"{e.id} names two events"
