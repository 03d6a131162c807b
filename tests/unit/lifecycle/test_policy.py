"""The remediation policy on the catalog's semantics and on thresholds from a policy file."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, Severity
from gpufleet.lifecycle.config import load_policy
from gpufleet.lifecycle.decisions import ActionKind
from gpufleet.lifecycle.policy import NodeView, Policy
from gpufleet.lifecycle.states import NodeState

from .helpers import T0, ev, policy, xid

S = NodeState
SINCE = T0 - timedelta(hours=1)


def view(state: NodeState = S.IN_SERVICE, jobs: bool = True) -> NodeView:
    return NodeView("n1", state, SINCE, jobs)


def kinds(d: object) -> list[ActionKind]:
    return [a.kind for a in d.actions]  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", [79, 48, 95, 64, 74, 119])
def test_fatal_xid_drains_now_and_requeues(code: int) -> None:
    d = policy().evaluate(view(), [xid("n1", code, T0)], T0)
    assert d is not None
    assert (d.from_state, d.to_state, d.severity) == (S.IN_SERVICE, S.DRAINING, Severity.FATAL)
    assert kinds(d) == [ActionKind.DRAIN, ActionKind.REQUEUE_JOBS]
    assert str(code) in d.reason


def test_fatal_on_idle_node_drains_without_requeue() -> None:
    d = policy().evaluate(view(S.READY, jobs=False), [xid("n1", 79, T0)], T0)
    assert d is not None and kinds(d) == [ActionKind.DRAIN]


def test_degraded_makes_suspect_and_drains_after_checkpoint() -> None:
    d = policy().evaluate(view(), [xid("n1", 94, T0)], T0)
    assert d is not None
    assert d.to_state == S.SUSPECT and d.severity == Severity.DEGRADED
    assert kinds(d) == [ActionKind.DRAIN_AFTER_CHECKPOINT]


def test_degraded_on_idle_node_drains_at_once() -> None:
    d = policy().evaluate(view(S.READY, jobs=False), [ev("n1", EventKind.ROW_REMAP_PENDING, T0)], T0)
    assert d is not None and d.to_state == S.DRAINING and kinds(d) == [ActionKind.DRAIN]


@pytest.mark.parametrize("code", [13, 31, 43, 45, 154])
def test_informational_and_collateral_xids_only_record(code: int) -> None:
    assert policy().evaluate(view(), [xid("n1", code, T0)], T0) is None


def test_worst_event_wins_and_evidence_lists_it() -> None:
    events = [xid("n1", 13, T0), xid("n1", 94, T0), xid("n1", 79, T0 + timedelta(seconds=1))]
    d = policy().evaluate(view(), events, T0 + timedelta(seconds=2))
    assert d is not None and d.to_state == S.DRAINING
    assert d.evidence == (events[2].id,)


def test_evidence_from_before_the_last_transition_does_not_trigger() -> None:
    old = xid("n1", 79, SINCE - timedelta(minutes=10))
    assert policy().evaluate(view(S.READY), [old], T0) is None
    assert policy().evaluate(view(S.READY), [old], T0, fresh_ids=frozenset({old.id})) is None


def test_slightly_early_evidence_within_the_clock_skew_counts() -> None:
    early = xid("n1", 79, SINCE - timedelta(minutes=2))
    d = policy().evaluate(view(S.READY), [early], T0, fresh_ids=frozenset({early.id}))
    assert d is not None and d.to_state == S.DRAINING
    strict = policy({"policy": {"clock_skew": "0s"}})
    assert strict.evaluate(view(S.READY), [early], T0, fresh_ids=frozenset({early.id})) is None


def test_only_newly_arrived_evidence_triggers() -> None:
    seen = xid("n1", 79, T0)
    other = xid("n1", 13, T0)
    assert policy().evaluate(view(), [seen, other], T0, fresh_ids=frozenset({other.id})) is None


def test_xid94_twice_in_24h_escalates_to_fatal() -> None:
    first, second = xid("n1", 94, SINCE - timedelta(hours=3)), xid("n1", 94, T0)
    d = policy().evaluate(view(S.SUSPECT), [first, second], T0)
    assert d is not None and d.severity == Severity.FATAL and d.to_state == S.DRAINING
    assert "2 times" in d.reason
    # ...but not when the first one is outside the window
    far = xid("n1", 94, T0 - timedelta(hours=25))
    assert policy().evaluate(view(S.SUSPECT), [far, second], T0) is None


def test_thresholds_and_overrides_come_from_the_policy_file(tmp_path: Path) -> None:
    f = tmp_path / "policy.toml"
    f.write_text('''
[[override]]
kind = "xid"
code = 13
severity = "fatal"
action = "reset_gpu"

[[escalation]]
kind = "ecc_sbe"
count = 3
window = "10m"
severity = "degraded"
''')
    pf = load_policy(f)
    p = Policy(pf.config, pf.catalog)
    d = p.evaluate(view(), [xid("n1", 13, T0)], T0)
    assert d is not None and d.severity == Severity.FATAL
    sbe = [ev("n1", EventKind.ECC_SBE, T0 - timedelta(minutes=m)) for m in (1, 2)]
    assert p.evaluate(view(), sbe, T0) is None
    sbe.append(ev("n1", EventKind.ECC_SBE, T0))
    d = p.evaluate(view(), sbe, T0)
    assert d is not None and d.severity == Severity.DEGRADED and "3 times" in d.reason


def test_producer_severity_overrides_the_catalog() -> None:
    d = policy().evaluate(view(), [ev("n1", EventKind.THERMAL, T0, severity=Severity.FATAL)], T0)
    assert d is not None and d.severity == Severity.FATAL


def test_revalidation_pass_returns_to_ready_and_resumes() -> None:
    d = policy().evaluate(view(S.REVALIDATE, jobs=False), [ev("n1", EventKind.CHECK_PASSED, T0)], T0)
    assert d is not None and d.to_state == S.READY and kinds(d) == [ActionKind.RESUME]


def test_revalidation_failure_goes_back_to_repair() -> None:
    events = [ev("n1", EventKind.CHECK_PASSED, T0), ev("n1", EventKind.CHECK_FAILED, T0)]
    d = policy().evaluate(view(S.REVALIDATE, jobs=False), events, T0)
    # drained again: a validation job may have run with the node undrained in a maintenance reservation
    assert d is not None and d.to_state == S.REPAIR and kinds(d) == [ActionKind.DRAIN, ActionKind.REPAIR]


def test_time_rules_auto_repair_and_burn_in() -> None:
    p = policy()
    d = p.on_tick(view(S.DRAINED, jobs=False), T0)
    assert d is not None and d.to_state == S.REPAIR
    d = p.on_tick(view(S.NEW, jobs=False), T0)
    assert d is not None and d.to_state == S.BURN_IN and kinds(d) == [ActionKind.DRAIN, ActionKind.VALIDATE]
    off = policy({"policy": {"auto_repair": False, "auto_burn_in": False}})
    assert off.on_tick(view(S.DRAINED, jobs=False), T0) is None
    assert off.on_tick(view(S.NEW, jobs=False), T0) is None


def test_decision_ids_are_deterministic_for_the_same_evidence() -> None:
    e = xid("n1", 79, T0)
    a = policy().evaluate(view(), [e], T0)
    b = policy().evaluate(view(), [e], T0 + timedelta(seconds=5))
    assert a is not None and b is not None and a.id == b.id


def test_a_short_checkpoint_wait_under_the_default_grace_is_accepted() -> None:
    """Only a grace the file sets is refused above the timeout: the default grace (10 min) over a short
    checkpoint_wait_timeout is what a site asking for quick drains writes."""
    from gpufleet.lifecycle.config import parse_policy

    pf = parse_policy({"policy": {"checkpoint_wait_timeout": "2s"}, "reconciler": {"retry_cap": "1s"}})
    assert pf.config.checkpoint_wait_timeout.total_seconds() == 2 and pf.config.retry_cap.total_seconds() == 1


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"policy": {"evidence_window": "soon"}}, "policy.evidence_window"),
        ({"breaker": {"max_unavailable_fleet": 1.5}}, "breaker.max_unavailable_fleet"),
        ({"policy": {"auto_repair": "yes"}}, "policy.auto_repair"),
        ({"policy": {"no_such_key": 1}}, "policy.no_such_key"),
        ({"policy": {"correlation_false_alarm_budget": 0}}, "policy.correlation_false_alarm_budget"),
        ({"policy": {"correlation_false_alarm_budget": 1.5}}, "policy.correlation_false_alarm_budget"),
        ({"policy": {"correlation_false_alarm_budget": "1/1000"}}, "policy.correlation_false_alarm_budget"),
        ({"policy": {"correlation_false_alarm_budget": True}}, "policy.correlation_false_alarm_budget"),
        ({"policy": {"correlation_false_alarm_budget": 1e-320}}, "policy.correlation_false_alarm_budget"),
        ({"nonsense": {}}, "nonsense"),
        ({"policy": {"validation_start_timeout": "0s"}}, "policy.validation_start_timeout"),
        ({"policy": {"validation_start_timeout": "2d"}}, "policy.validation_start_timeout"),
        ({"escalation": [{"kind": "xid", "code": 94, "count": 0, "window": "1h"}]}, "escalation[0].count"),
        ({"override": [{"kind": "bogus", "severity": "fatal"}]}, "override[0].kind"),
        ({"override": [{"kind": "xid", "code": 1, "severity": "catastrophic"}]}, "override[0].severity"),
        # valid alone, contradictory together (a drill had them accepted silently)
        ({"policy": {"checkpoint_grace": "5h", "checkpoint_wait_timeout": "3m"}}, "policy.checkpoint_grace"),
        ({"reconciler": {"retry_base": "1m", "retry_cap": "10s"}}, "reconciler.retry_base"),
    ],
)
def test_bad_policy_names_the_field_and_value(doc: dict[str, object], field: str) -> None:
    from gpufleet.lifecycle.config import parse_policy

    with pytest.raises(InvalidInput) as err:
        parse_policy(doc)
    assert err.value.field == field
    assert str(err.value).startswith(field)


def test_validation_start_timeout_says_its_range() -> None:
    from gpufleet.lifecycle.config import parse_policy

    assert parse_policy({}).config.validation_start_timeout == timedelta(minutes=10)
    shortest = parse_policy({"policy": {"validation_start_timeout": "1s"}}).config
    assert shortest.validation_start_timeout == timedelta(seconds=1)
    with pytest.raises(InvalidInput) as err:
        parse_policy({"policy": {"validation_start_timeout": "25h"}})
    assert str(err.value) == "policy.validation_start_timeout: got '25h', expected a duration from 1s to 1d, e.g. 10m"


def test_missing_or_broken_policy_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="policy_file"):
        load_policy(tmp_path / "absent.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy\n")
    with pytest.raises(InvalidInput, match="valid TOML"):
        load_policy(bad)


def test_the_correlation_false_alarm_budget_is_read_from_the_policy() -> None:
    from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET
    from gpufleet.lifecycle.config import parse_policy

    assert parse_policy({}).config.correlation_false_alarm_budget == FALSE_ALARM_BUDGET
    assert parse_policy({"policy": {"correlation_false_alarm_budget": 0.01}}).config.correlation_false_alarm_budget \
        == 0.01
    assert parse_policy({"policy": {"correlation_false_alarm_budget": 1}}).config.correlation_false_alarm_budget == 1.0
