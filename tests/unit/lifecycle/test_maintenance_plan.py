"""Maintenance rollouts, the pure part: selectors, the spec's validation, and admission (how many nodes
may be out at once, counting the nodes already out for other reasons)."""

from __future__ import annotations

from collections.abc import Set
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput
from gpufleet.lifecycle.breaker import Budget
from gpufleet.lifecycle.maintenance import Selector, Spec, admit, check_action, waves

DOMAINS = {
    "a1": frozenset({"rack:a", "switch:l1"}), "a2": frozenset({"rack:a", "switch:l1"}),
    "a3": frozenset({"rack:a", "switch:l2"}), "b1": frozenset({"rack:b", "switch:l2"}),
    "b2": frozenset({"rack:b", "switch:l3"}), "b3": frozenset({"rack:b", "switch:l3"}),
}


def no_breaker(_node: str, _out: Set[str]) -> str | None:
    return None


def spec(**kw: object) -> Spec:
    return Spec.of_dict({"selector": "all", "action": "reboot", **kw})


# ---- selectors and the spec --------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    ("all", ["a1", "a2", "a3", "b1", "b2", "b3"]),
    ("rack:b", ["b1", "b2", "b3"]),
    ("switch:l2", ["a3", "b1"]),
    ("nodes:b2,a1,b2", ["a1", "b2"]),  # rollout order (rack, name), each once
])
def test_selectors_pick_the_nodes_in_rollout_order(text: str, expected: list[str]) -> None:
    assert Selector.parse(text).select(DOMAINS) == expected


@pytest.mark.parametrize(("text", "field", "says"), [
    ("everything", "selector", "all, rack:<rack>"),
    ("rack:", "selector", "all, rack:<rack>"),
    ("rack:zz", "selector", "matches at least one"),
    ("nodes:a1,ghost", "selector", "unknown: ghost"),
])
def test_a_bad_selector_names_the_field_the_value_and_what_was_expected(text: str, field: str, says: str) -> None:
    with pytest.raises(InvalidInput) as err:
        Selector.parse(text).select(DOMAINS)
    assert err.value.field == field and err.value.value == text and says in err.value.expected


@pytest.mark.parametrize(("body", "field"), [
    ({"action": "rm -rf /"}, "action"),  # never a command line: a name the agent's config lists
    ({"action": "script:Driver Update"}, "action"),
    ({"max_unavailable": 0}, "max_unavailable"),
    ({"max_unavailable_domain": "2"}, "max_unavailable_domain"),
    ({"on_failure": "ignore"}, "on_failure"),
    ({"validate": "burnin"}, "validate"),
    ({"action_timeout": "soon"}, "action_timeout"),
    ({"drain_timeout": 0}, "drain_timeout"),
    ({"batch": 3}, "batch"),
])
def test_a_bad_spec_field_is_named(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        Spec.of_dict({"selector": "all", "action": "reboot", **body})
    assert err.value.field == field


def test_a_spec_survives_its_stored_form() -> None:
    s = spec(action="script:driver-550", max_unavailable=3, max_unavailable_domain=2, on_failure="continue",
             validate="quick", action_timeout="45m", drain_timeout=90)
    again = Spec.of_dict(s.as_dict())
    assert again == s and again.action_timeout == timedelta(minutes=45) and again.drain_timeout == timedelta(seconds=90)
    assert check_action("reboot") == "reboot"


# ---- admission ------------------------------------------------------------------------------------------
def test_nodes_already_out_for_other_reasons_count_against_max_unavailable() -> None:
    order = Selector.parse("all").select(DOMAINS)
    got = admit(order, {"b3"}, DOMAINS, spec(max_unavailable=2, max_unavailable_domain=2), no_breaker)
    assert got.start == ("a1",)  # b3 (in repair, say) is one of the two
    assert got.waiting["a2"].startswith("max_unavailable: 2 node(s) of the fleet")
    assert got.waiting["b3"] == "already unavailable"


def test_a_node_that_does_not_fit_its_domain_does_not_hold_up_another_domain() -> None:
    got = admit(["a1", "a2", "b2"], set(), DOMAINS, spec(max_unavailable=3, max_unavailable_domain=1), no_breaker)
    assert got.start == ("a1", "b2")
    assert got.waiting["a2"].startswith("max_unavailable_domain: 1 node(s) of rack:a")


def test_the_breaker_budget_has_the_last_word() -> None:
    budget = Budget(max_fleet=0.2, max_domain=1.0)  # 6 nodes: at most 1 out
    members = {d: frozenset(n for n, ds in DOMAINS.items() if d in ds) for ds in DOMAINS.values() for d in ds}

    def breaker(node: str, out: Set[str]) -> str | None:
        return budget.violation(node, out, DOMAINS, members, len(DOMAINS))

    got = admit(["a1", "b2"], set(), DOMAINS, spec(max_unavailable=5, max_unavailable_domain=5), breaker)
    assert got.start == ("a1",) and got.waiting["b2"].startswith("fleet budget: 2 of 6")


def test_plan_preview_batches_respect_the_domain_limit() -> None:
    batches = waves(Selector.parse("all").select(DOMAINS), set(), DOMAINS, spec(max_unavailable=2), no_breaker)
    assert batches == [["a1", "b1"], ["a2", "b2"], ["a3", "b3"]]  # one per rack; b1 shares no switch with a1


node_names = st.sampled_from([f"n{i}" for i in range(12)])
domain_names = st.sampled_from(["rack:r1", "rack:r2", "rack:r3", "switch:s1", "switch:s2"])


@settings(max_examples=300, deadline=None)
@given(domains=st.dictionaries(node_names, st.frozensets(domain_names, max_size=3), min_size=1),
       out=st.frozensets(node_names), fleet_max=st.integers(1, 6), domain_max=st.integers(1, 4),
       data=st.data())
def test_admission_never_exceeds_max_unavailable_counting_nodes_already_out(
        domains: dict[str, frozenset[str]], out: frozenset[str], fleet_max: int, domain_max: int,
        data: st.DataObject) -> None:
    out = frozenset(n for n in out if n in domains)
    order = data.draw(st.permutations(sorted(set(domains) - out)))
    got = admit(order, out, domains, spec(max_unavailable=fleet_max, max_unavailable_domain=domain_max), no_breaker)
    after = set(out) | set(got.start)
    if got.start:  # the rollout added nodes: then no limit is exceeded, whatever was out before
        assert len(after) <= fleet_max
        for node in got.start:
            for d in domains[node]:
                assert len({n for n in after if d in domains[n]}) <= domain_max, (d, after)
    # Never idle without a reason: a node that could go out on its own starts, or another one did.
    for node in order:
        alone_fits = len(out) + 1 <= fleet_max and all(
            len({n for n in out if d in domains[n]}) + 1 <= domain_max for d in domains[node])
        if alone_fits:
            assert got.start, f"{node} fits alone, yet nothing started"
    assert set(got.start).isdisjoint(got.waiting) and set(got.start) | set(got.waiting) == set(order)
