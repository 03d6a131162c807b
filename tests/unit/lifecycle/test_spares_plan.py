"""Hot-spare pools, the pure core (lifecycle.spares): pool accounting and the nearest-domain choice."""

from __future__ import annotations

from collections.abc import Mapping, Set

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidInput
from gpufleet.lifecycle.breaker import Budget
from gpufleet.lifecycle.spares import Held, NodeView, PoolSpec, Role, applied, distance, plan_pool, tally


def no_breaker(_node: str, _out: Set[str]) -> str | None:
    return None


def pool(**kw: object) -> PoolSpec:
    base: dict[str, object] = {"name": "p", "big_partition": "train", "backfill_partition": "sweep", "count": 1}
    base.update(kw)
    return PoolSpec(**base)  # type: ignore[arg-type]


def doms(rack: str, leaf: str) -> frozenset[str]:
    return frozenset({f"rack:{rack}", f"switch:{leaf}"})


# Two racks; rack r1 has two leaves (a, b), rack r2 one (c).
TOPO = {"n1": doms("r1", "a"), "n2": doms("r1", "a"), "n3": doms("r1", "a"),
        "n4": doms("r1", "b"), "n5": doms("r1", "b"),
        "n6": doms("r2", "c"), "n7": doms("r2", "c")}


def views(unhealthy: Set[str] = frozenset(), busy: Set[str] = frozenset(),
          topo: Mapping[str, frozenset[str]] = TOPO) -> dict[str, NodeView]:
    return {n: NodeView(d, n not in unhealthy, n in busy) for n, d in topo.items()}


def test_a_fresh_pool_designates_its_count_per_domain_from_the_last_idle_nodes_and_lends_them() -> None:
    plan = plan_pool(pool(), views(busy={"n5"}), {}, set(), no_breaker)
    assert plan.designate == ("n3", "n4", "n7")  # n5 runs a job: n4 is taken instead
    assert plan.lend == {"n3", "n4", "n7"} and not plan.keep
    counts = tally(pool(), views(busy={"n5"}), applied({}, plan))
    assert [(c.domain, c.target, c.ready, c.lent) for c in counts] == [
        ("switch:a", 1, 1, 0), ("switch:b", 1, 1, 0), ("switch:c", 1, 1, 0)]


def test_a_share_is_rounded_up_per_domain_and_keep_idle_spares_are_never_lent() -> None:
    spec = pool(count=None, share=0.5, per="rack", keep_idle=1)
    plan = plan_pool(spec, views(), {}, set(), no_breaker)
    assert {c.domain: c.target for c in tally(spec, views(), {})} == {"rack:r1": 3, "rack:r2": 1}
    assert set(plan.designate) == {"n3", "n4", "n5", "n7"}
    assert plan.keep == {"n3", "n7"} and plan.lend == {"n4", "n5"}  # the last spare of r2 is kept, not lent


def test_a_failed_working_node_is_replaced_by_the_spare_behind_its_own_leaf_first() -> None:
    held = {"n3": Held(Role.SPARE), "n5": Held(Role.SPARE), "n7": Held(Role.SPARE)}
    plan = plan_pool(pool(), views(unhealthy={"n1"}, busy={"n3", "n5", "n7"}), held, {"n1"}, no_breaker)
    assert plan.reclaim == (("n3", "n1"),) and not plan.designate  # no refill while a replacement runs


def test_then_the_same_rack_then_anywhere_and_an_idle_spare_before_a_lent_one() -> None:
    held = {"n5": Held(Role.SPARE), "n4": Held(Role.SPARE), "n7": Held(Role.SPARE)}
    plan = plan_pool(pool(count=2), views(unhealthy={"n1"}, busy={"n5"}), held, {"n1"}, no_breaker)
    assert plan.reclaim == (("n4", "n1"),)  # same rack, idle before the busy n5
    held = {"n7": Held(Role.SPARE)}
    plan = plan_pool(pool(), views(unhealthy={"n1"}), held, {"n1"}, no_breaker)
    assert plan.reclaim == (("n7", "n1"),)


def test_a_spare_over_the_blast_radius_budget_is_passed_over_for_the_next_nearest() -> None:
    held = {"n3": Held(Role.SPARE), "n7": Held(Role.SPARE)}

    def breaker(node: str, _out: Set[str]) -> str | None:
        return "domain budget: switch:a" if node == "n3" else None

    plan = plan_pool(pool(), views(unhealthy={"n1"}), held, {"n1"}, breaker)
    assert plan.reclaim == (("n7", "n1"),)
    plan = plan_pool(pool(), views(unhealthy={"n1"}), {"n3": Held(Role.SPARE)}, {"n1"}, breaker)
    assert not plan.reclaim and "n3: domain budget" in plan.waiting["n1"]


def test_a_replacement_in_progress_is_not_made_twice_and_settles_when_the_failed_node_is_back() -> None:
    held = {"n3": Held(Role.RECLAIMING, "n1"), "n7": Held(Role.SPARE)}
    plan = plan_pool(pool(), views(unhealthy={"n1"}), held, {"n1"}, no_breaker)
    assert not plan.reclaim and not plan.settle
    held = {"n3": Held(Role.RECLAIMED, "n1"), "n5": Held(Role.SPARE), "n7": Held(Role.SPARE)}
    assert not plan_pool(pool(), views(unhealthy={"n1"}), held, {"n1"}, no_breaker).designate
    back = plan_pool(pool(), views(), held, set(), no_breaker)
    assert back.settle == ("n3",)
    # leaf a has no spare any more: refilled with an idle node (n2: n3 is settling, n1 was just repaired)
    assert back.designate == ("n2",)


def test_a_node_the_scheduler_cannot_see_yet_is_no_failure_and_no_spare() -> None:
    vs = views(unhealthy={"n1", "n3"})
    vs["n1"] = NodeView(TOPO["n1"], healthy=False, busy=False, unknown=True)  # slurmd not registered yet
    vs["n3"] = NodeView(TOPO["n3"], healthy=False, busy=False, unknown=True)
    plan = plan_pool(pool(), vs, {"n7": Held(Role.SPARE)}, set(), no_breaker)
    assert not plan.reclaim and not plan.waiting and "n3" not in plan.designate


def test_no_spare_left_says_so() -> None:
    plan = plan_pool(pool(), views(unhealthy={"n1", "n2"}), {"n3": Held(Role.SPARE)}, {"n1", "n2"}, no_breaker)
    assert plan.reclaim == (("n3", "n1"),) and plan.waiting == {"n2": "no healthy spare left in the pool"}


def test_distance() -> None:
    assert distance(TOPO["n1"], TOPO["n2"]) == 0
    assert distance(TOPO["n1"], TOPO["n4"]) == 1
    assert distance(TOPO["n1"], TOPO["n6"]) == 2


@pytest.mark.parametrize(("kw", "field"), [
    ({"count": None}, "spares.pools.count"),
    ({"share": 0.1}, "spares.pools.count"),
    ({"count": -1}, "spares.pools.count"),
    ({"count": None, "share": 1.0}, "spares.pools.share"),
    ({"per": "row"}, "spares.pools.per"),
    ({"backfill_partition": "train"}, "spares.pools.backfill_partition"),
    ({"big_partition": "a,b"}, "spares.pools.big_partition"),
    ({"keep_idle": -1}, "spares.pools.keep_idle"),
    ({"name": "a b"}, "spares.pools.name"),
])
def test_a_bad_pool_names_the_field_and_what_was_expected(kw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        pool(**kw)
    assert err.value.field == field and err.value.expected


# ---- properties -----------------------------------------------------------------------------
names = [f"n{i}" for i in range(1, 13)]
topo_st = st.fixed_dictionaries({n: st.tuples(st.sampled_from(["r1", "r2"]), st.sampled_from(["a", "b", "c"]))
                                 for n in names})


@st.composite
def worlds(draw: st.DrawFn) -> tuple[PoolSpec, dict[str, NodeView], dict[str, Held], set[str]]:
    topo = {n: doms(r, f"{r}{leaf}") for n, (r, leaf) in draw(topo_st).items()}
    spec = pool(count=draw(st.integers(0, 3)), keep_idle=draw(st.integers(0, 2)),
                per=draw(st.sampled_from(["switch", "rack"])))
    unhealthy = draw(st.sets(st.sampled_from(names), max_size=6))
    busy = draw(st.sets(st.sampled_from(names), max_size=8))
    roles = draw(st.dictionaries(st.sampled_from(names), st.sampled_from([Role.SPARE, Role.RECLAIMED]), max_size=6))
    held = {n: Held(r, draw(st.sampled_from(names)) if r == Role.RECLAIMED else "") for n, r in roles.items()}
    return spec, views(unhealthy, busy, topo), held, set(unhealthy)


@settings(max_examples=300, deadline=None)
@given(worlds(), st.integers(0, 2))
def test_a_pool_never_goes_below_zero_never_reuses_a_spare_and_never_reclaims_over_budget(
        world: tuple[PoolSpec, dict[str, NodeView], dict[str, Held], set[str]], share_out: int) -> None:
    spec, vs, held, out = world
    topo = {n: v.domains for n, v in vs.items()}
    members: dict[str, frozenset[str]] = {}
    for n, ds in topo.items():
        for d in ds:
            members[d] = members.get(d, frozenset()) | {n}
    budget = Budget(max_fleet=0.5, max_domain=[0.25, 0.5, 0.75][share_out])

    def breaker(node: str, o: Set[str]) -> str | None:
        return budget.violation(node, o, topo, members, len(topo))

    plan = plan_pool(spec, vs, held, out, breaker)
    spares = [s for s, _ in plan.reclaim]
    assert len(spares) == len(set(spares)), "a spare is reclaimed once"
    assert all(held.get(s) == Held(Role.SPARE) and vs[s].healthy for s, _ in plan.reclaim), "only healthy spares"
    assert not set(plan.designate) & set(held), "a node the pool holds is never designated again"
    assert not (set(plan.designate) and (plan.reclaim or plan.waiting)), "no refill while a failure waits"
    after = applied(held, plan)
    for c in tally(spec, vs, after):
        assert min(c.ready, c.lent, c.reclaiming, c.reclaimed) >= 0
        assert c.ready + c.lent <= max(c.target, sum(1 for h in held.values() if h.role == Role.SPARE)), c
    assert not plan.lend & plan.keep and not (plan.lend | plan.keep) & set(spares)
    # every reclaim fits the budget with the disruptions chosen before it in the same pass
    disrupted = set(out)
    for s, f in plan.reclaim:
        assert breaker(s, disrupted) is None, (s, f, disrupted)
        disrupted.add(s)
    # keep_idle: each domain keeps that many of its spares out of the backfill partition (if it has them)
    for c in tally(spec, vs, after):
        mine = {n for n in (plan.lend | plan.keep) if spec.domain_of(vs[n].domains) == c.domain}
        assert len(mine & plan.keep) == min(spec.keep_idle, len(mine))
