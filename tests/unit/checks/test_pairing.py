from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.checks.pairing import Pair, first_pass_rounds, localise, second_pass_rounds
from gpufleet.domain.errors import InvalidInput


class FakeFabric:
    """Pair bandwidth = the slower node's speed, times a link factor; records what was measured."""

    def __init__(
        self, speed: Mapping[str, float], bad_links: Mapping[frozenset[str], float] | None = None
    ) -> None:
        self.speed = speed
        self.bad_links = bad_links or {}
        self.rounds: list[list[Pair]] = []

    def __call__(self, pairs: Sequence[Pair]) -> dict[Pair, float]:
        nodes = [n for p in pairs for n in p]
        assert len(nodes) == len(set(nodes)), f"a node appears twice in one round: {pairs}"
        self.rounds.append(list(pairs))
        return {
            (a, b): min(self.speed[a], self.speed[b]) * self.bad_links.get(frozenset((a, b)), 1.0)
            for a, b in pairs
        }


def _nodes(n: int) -> list[str]:
    return [f"n{i:02d}" for i in range(n)]


def test_first_pass_pairs_everyone_and_the_odd_one_out() -> None:
    assert first_pass_rounds(["a", "b", "c", "d"]) == [[("a", "b"), ("c", "d")]]
    assert first_pass_rounds(["a", "b", "c", "d", "e"]) == [[("a", "b"), ("c", "d")], [("e", "a")]]
    assert first_pass_rounds(["a", "b", "c"]) == [[("a", "b")], [("c", "a")], [("b", "c")]]
    with pytest.raises(InvalidInput) as err:
        first_pass_rounds(["a"])
    assert err.value.field == "nodes"
    with pytest.raises(InvalidInput):
        first_pass_rounds(["a", "a"])


def test_second_pass_never_uses_a_good_node_twice_in_a_round() -> None:
    rounds = second_pass_rounds(["s1", "s2", "s3"], ["g1", "g2"])
    assert rounds == [[("s1", "g1"), ("s2", "g2")], [("s3", "g1")]]
    assert second_pass_rounds(["s1"], []) == []


def test_the_slow_node_is_blamed_and_its_partner_cleared() -> None:
    speed = dict.fromkeys(_nodes(8), 100.0) | {"n05": 40.0}
    fabric = FakeFabric(speed)
    loc = localise(_nodes(8), fabric)
    assert loc.blamed == ("n05",)
    assert loc.cleared == ("n04",)  # the partner of the first pass, fine with a known-good node
    assert loc.inconclusive == () and loc.blamed_links == ()
    assert not loc.ok
    assert loc.reference == 100.0 and loc.bar == 75.0


def test_a_slow_link_is_blamed_when_both_ends_are_fine_elsewhere() -> None:
    speed = dict.fromkeys(_nodes(6), 100.0)
    fabric = FakeFabric(speed, {frozenset(("n02", "n03")): 0.3})
    loc = localise(_nodes(6), fabric)
    assert loc.blamed == ()
    assert set(loc.cleared) == {"n02", "n03"}
    assert loc.blamed_links == (("n02", "n03"),)


def test_two_nodes_cannot_be_told_apart() -> None:
    loc = localise(["a", "b"], FakeFabric({"a": 100.0, "b": 10.0}), floor=50.0)
    assert loc.blamed == () and loc.inconclusive == ("a", "b")


def test_absolute_floor_applies_even_when_every_pair_is_equally_slow() -> None:
    loc = localise(_nodes(4), FakeFabric(dict.fromkeys(_nodes(4), 10.0)), floor=50.0)
    assert set(loc.inconclusive) == set(_nodes(4))
    loc2 = localise(_nodes(4), FakeFabric(dict.fromkeys(_nodes(4), 10.0)), floor=5.0)
    assert loc2.ok


def test_bootstrap_finds_good_nodes_when_every_first_pair_failed() -> None:
    speed = {"n00": 10.0, "n01": 100.0, "n02": 10.0, "n03": 100.0}  # both first pairs contain a slow node
    loc = localise(_nodes(4), FakeFabric(speed), floor=50.0)
    assert set(loc.blamed) == {"n00", "n02"}
    assert set(loc.good) == {"n01", "n03"}


def test_bad_parameters_are_clear() -> None:
    with pytest.raises(InvalidInput) as err:
        localise(_nodes(4), FakeFabric(dict.fromkeys(_nodes(4), 1.0)), tolerance=1.5)
    assert err.value.field == "tolerance"

    def forgetful(pairs: Sequence[Pair]) -> dict[Pair, float]:
        return {}

    with pytest.raises(InvalidInput) as err2:
        localise(_nodes(4), forgetful)
    assert err2.value.field == "measure"


@given(n=st.integers(3, 24), slow=st.data(), factor=st.floats(0.05, 0.6))
def test_exactly_the_injected_slow_node_is_blamed(n: int, slow: st.DataObject, factor: float) -> None:
    nodes = _nodes(n)
    bad = slow.draw(st.sampled_from(nodes))
    speed = dict.fromkeys(nodes, 100.0) | {bad: 100.0 * factor}
    loc = localise(nodes, FakeFabric(speed))
    assert loc.blamed == (bad,)
    assert loc.inconclusive == () and loc.blamed_links == ()


def test_a_node_paired_with_one_known_good_partner_is_blamed_below_the_floor_the_partner_never() -> None:
    """Two nodes: without known-good knowledge a slow pair is inconclusive; with the partner known
    good, the node under test is blamed and the partner is not even a suspect."""
    fabric = FakeFabric({"fixed": 5.0, "partner": 100.0})
    plain = localise(["fixed", "partner"], fabric, floor=20.0)
    assert plain.inconclusive == ("fixed", "partner") and plain.blamed == ()
    loc = localise(["fixed", "partner"], FakeFabric({"fixed": 5.0, "partner": 100.0}), floor=20.0,
                   known_good=["partner"])
    assert loc.blamed == ("fixed",) and loc.good == ("partner",) and loc.inconclusive == ()
    healthy = localise(["fixed", "partner"], FakeFabric({"fixed": 90.0, "partner": 100.0}), floor=20.0,
                       known_good=["partner"])
    assert healthy.ok and healthy.blamed == ()


def test_known_good_partners_are_never_blamed_even_when_every_pair_is_slow() -> None:
    # Two partners: their own pair is the reference; the fixed node's pairs are far below it.
    speed = {"fixed": 30.0, "p1": 100.0, "p2": 100.0}
    loc = localise(["fixed", "p1", "p2"], FakeFabric(speed), known_good=["p1", "p2"])
    assert loc.blamed == ("fixed",) and set(loc.good) == {"p1", "p2"}
    with pytest.raises(InvalidInput) as err:
        localise(["fixed", "p1"], FakeFabric(speed), known_good=["p9"])
    assert err.value.field == "known_good"
