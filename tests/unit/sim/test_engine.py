"""The simulator against closed forms, the Llama 3 calibration and its own policy levers."""

from __future__ import annotations

import math

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput import theory
from gpufleet.sim.config import IntervalRule, SimConfig
from gpufleet.sim.control import FixedControl, LifecycleControl
from gpufleet.sim.engine import run_replica
from gpufleet.sim.failures import Detection, FailureCategory, Scope, llama3_categories, uniform_node_rate
from gpufleet.sim.montecarlo import run_many
from gpufleet.sim.repair import FixedRepair
from gpufleet.sim.scenarios import scenario

MIN = 60.0


def poisson_cfg(**kw: object) -> SimConfig:
    base = SimConfig(gpus=1024, days=60, categories=uniform_node_rate(0.05, 8), planned_per_node_day=0.0,
                     checkpoint_interval=30 * MIN, checkpoint_write=2 * MIN, restart_overhead=8 * MIN,
                     restore=2 * MIN, requeue=0.0, repair=FixedRepair(86400.0))
    return base.with_(**kw)


def fixed(cfg: SimConfig) -> FixedControl:
    return FixedControl(proactive_drain=cfg.proactive_drain)


def test_monte_carlo_ettr_matches_the_exact_renewal_formula() -> None:
    cfg = poisson_cfg()
    s = run_many(cfg, 16, 100, control_factory=fixed)
    rate = cfg.unexpected_rate()
    exact = theory.expected_ettr_exact(rate, cfg.interval(), cfg.checkpoint_write,
                                       cfg.restart_overhead + cfg.restore)
    # Sampling error plus the edge effect of a finite horizon (one segment and one restart at most).
    edge = (cfg.interval() + cfg.checkpoint_write + cfg.restart_overhead + cfg.restore) / cfg.horizon
    assert abs(s.ettr_mean() - exact) <= 4 * s.ettr_stderr() + edge
    # The check is only as good as the sampling error: keep it tight enough to catch a model error of
    # one checkpoint write per failure (~1 % of ETTR here).
    assert s.ettr_stderr() < 0.0025


def test_failure_count_matches_the_poisson_rate() -> None:
    cfg = poisson_cfg()
    s = run_many(cfg, 8, 7, control_factory=fixed)
    expected = cfg.unexpected_rate() * cfg.horizon  # held time is nearly all of the horizon
    got = s.mean_interruptions()["unexpected"]
    assert abs(got - expected) < 4 * math.sqrt(expected / 8) + 0.03 * expected


def test_llama3_reproduces_table5() -> None:
    sc = scenario("llama3-405b")
    s = run_many(sc.config, 8, 1)
    total = s.mean_interruptions()["total"]
    assert sc.interruptions is not None
    assert abs(total - sc.interruptions) <= 0.05 * sc.interruptions
    causes = s.mean_by_cause()
    for cause, count in sc.by_cause:
        assert abs(causes.get(cause, 0.0) - count) <= 0.20 * count, (cause, causes.get(cause))
    assert 0.88 < s.ettr_mean() < 0.95  # "effective training time > 90 %" with the stated assumptions


def test_lifecycle_policy_and_rule_table_agree_when_nothing_is_held() -> None:
    cfg = scenario("llama3-405b").config.with_(days=10.0, warning_fraction=0.5, proactive_drain=True)
    a = run_replica(cfg, 3, control=FixedControl(proactive_drain=True))
    ctl = LifecycleControl(proactive_drain=True)
    b = run_replica(cfg, 3, control=ctl)
    assert ctl.held == 0
    assert a.report == b.report
    # The production engine really took the nodes through its lifecycle.
    assert len(ctl.scheduler.effects) > 0
    assert {e[0] for e in ctl.scheduler.effects} >= {"drain", "resume"}


def test_proactive_drain_turns_unexpected_failures_into_planned_stops() -> None:
    base = scenario("llama3-405b").config.with_(days=20.0)
    warned = base.with_(warning_fraction=0.8, proactive_drain=True)
    b = run_many(base, 4, 11, control_factory=fixed)
    w = run_many(warned, 4, 11, control_factory=fixed)
    assert w.mean_interruptions()["unexpected"] < 0.8 * b.mean_interruptions()["unexpected"]
    assert w.mean_interruptions()["planned"] > b.mean_interruptions()["planned"]
    assert w.mean_badput_hours()["lost_progress"] < b.mean_badput_hours()["lost_progress"]


def test_without_spares_restarts_wait_for_repairs() -> None:
    cfg = poisson_cfg(days=20, repair=FixedRepair(6 * 3600.0))
    none_left = run_replica(cfg.with_(hot_spares=0), 5, control=FixedControl())
    plenty = run_replica(cfg, 5, control=FixedControl())
    assert none_left.node_waits > 0
    assert none_left.report.badput.waiting > 3600.0
    assert plenty.report.badput.waiting == 0.0
    assert none_left.report.ettr < plenty.report.ettr


def test_health_checks_shorten_hang_detection() -> None:
    hang = (FailureCategory("hang", "Unknown", 20 / (1024 * 24 * 30), Scope.JOB, Detection.WATCHDOG),)
    cfg = poisson_cfg(categories=hang, days=30, watchdog=1800.0)
    slow = run_replica(cfg, 2, control=FixedControl())
    checked = run_replica(cfg.with_(health_check_every=120.0), 2, control=FixedControl())
    n = slow.report.interruptions.unexpected
    assert n > 5
    assert slow.report.badput.detection == pytest.approx(n * 1800.0)
    assert checked.report.badput.detection <= checked.report.interruptions.unexpected * 120.0


def test_health_check_cost_is_paid_per_check() -> None:
    cfg = poisson_cfg(categories=(), days=1, health_check_every=600.0, health_check_cost=6.0)
    r = run_replica(cfg, 0, control=FixedControl()).report
    # ~144 checks a day minus those that fall in checkpoint saves or the startup.
    assert 120 * 6.0 <= r.badput.health_check <= 144 * 6.0


def test_checkpoint_rules_resolve_to_young_and_daly() -> None:
    cfg = SimConfig(gpus=16384, checkpoint_write=60.0, checkpoint_interval="daly")
    assert cfg.checkpoint_interval is IntervalRule.DALY
    assert cfg.interval() == pytest.approx(theory.daly_interval(60.0, cfg.mtbf()))
    assert cfg.with_(checkpoint_interval=IntervalRule.YOUNG).interval() == pytest.approx(
        math.sqrt(2 * 60.0 * cfg.mtbf()))


def test_async_checkpoints_beat_blocking_ones_at_equal_bandwidth() -> None:
    blocking = poisson_cfg(checkpoint_write=3 * MIN)
    asynchronous = poisson_cfg(checkpoint_write=5.0, checkpoint_persist=3 * MIN)
    b = run_many(blocking, 6, 21, control_factory=fixed)
    a = run_many(asynchronous, 6, 21, control_factory=fixed)
    assert a.ettr_mean() > b.ettr_mean()
    assert a.mean_badput_hours()["checkpoint_save"] < b.mean_badput_hours()["checkpoint_save"]


def test_llama3_categories_use_table5_counts() -> None:
    cats = {c.name: c for c in llama3_categories()}
    assert len(cats) == 18
    total = sum(c.per_gpu_hour for c in cats.values()) * 16384 * 54 * 24
    assert total == pytest.approx(419)
    low = sum(c.per_gpu_hour for c in llama3_categories(faulty_gpu=126)) * 16384 * 54 * 24
    assert low == pytest.approx(397)


@pytest.mark.parametrize(("field", "value"), [("gpus", 0), ("days", -1.0), ("warning_fraction", 1.5),
                                              ("checkpoint_interval", "hourly"), ("hot_spares", -2),
                                              ("checkpoint_write", float("nan")), ("repair_escape", 2.0),
                                              ("nodes_per_rack", -1), ("escape_refail_mean", 0.0)])
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidInput) as err:
        SimConfig(**{field: value})  # type: ignore[arg-type]
    assert err.value.field == field


def test_breaker_holds_drains_in_small_racks_until_the_operator_resets_it() -> None:
    cfg = poisson_cfg(days=30, hot_spares=8, repair=FixedRepair(2 * 86400.0), nodes_per_rack=4,
                      operator_response=12 * 3600.0, categories=uniform_node_rate(0.01, 8))
    ctl = LifecycleControl(operator_response=cfg.operator_response)
    held = run_replica(cfg, 9, control=ctl)
    free = run_replica(cfg.with_(nodes_per_rack=0), 9, control=LifecycleControl())
    # Two nodes of one 4-node rack out at once exceed the default 25 % domain budget.
    assert held.held_faults > 0
    assert ctl.resets > 0
    assert free.held_faults == 0
    # Held nodes wait for the operator before repair starts, so spares run short more often.
    assert held.node_waits >= free.node_waits
    assert held.report.ettr <= free.report.ettr + 1e-9


def test_revalidation_catches_faults_that_repairs_leave_behind() -> None:
    cfg = poisson_cfg(days=30, hot_spares=8, repair=FixedRepair(86400.0),
                      categories=uniform_node_rate(0.02, 8), repair_escape=0.5, escape_refail_mean=2 * 3600.0)
    clean = run_many(cfg.with_(repair_escape=0.0), 4, 5, control_factory=fixed)
    leaky = run_many(cfg, 4, 5, control_factory=fixed)
    controls: list[LifecycleControl] = []

    def lifecycle(c: SimConfig) -> LifecycleControl:
        controls.append(LifecycleControl())
        return controls[-1]

    checked = run_many(cfg.with_(revalidation=1800.0, revalidation_catch=1.0), 4, 5, control_factory=lifecycle)
    assert sum(r.escapes for r in leaky.replicas) > 10
    assert leaky.mean_interruptions()["unexpected"] > clean.mean_interruptions()["unexpected"] + 5
    # Every escaped fault is found by the production policy's validation path (revalidate -> repair).
    assert sum(r.escapes for r in checked.replicas) == 0
    assert sum(c.failed_validations for c in controls) > 10
    assert checked.ettr_mean() > leaky.ettr_mean()


def test_after_a_planned_stop_the_wait_for_a_node_is_waiting_not_planned_maintenance() -> None:
    # every failure warned and drained at the next checkpoint (a planned stop) and its node repaired for 6 h:
    # with no spare the job then waits for the repair
    cfg = poisson_cfg(days=20, warning_fraction=1.0, proactive_drain=True, repair=FixedRepair(6 * 3600.0))
    none_left = run_replica(cfg.with_(hot_spares=0), 5, control=fixed(cfg))
    plenty = run_replica(cfg, 5, control=fixed(cfg))
    assert none_left.report.interruptions.planned > 0 and none_left.node_waits > 0
    assert none_left.report.badput.waiting > 3600.0  # the wait for the repaired node
    assert plenty.report.badput.waiting == 0.0 and plenty.node_waits == 0
    # what stays planned_maintenance is the stops' own downtime: no more per stop than with spares enough
    per_stop = [r.report.badput.planned_maintenance / r.report.interruptions.planned for r in (none_left, plenty)]
    assert per_stop[0] <= per_stop[1] + 1e-6, per_stop
