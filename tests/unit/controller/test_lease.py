"""The lease rule (controller.ha.lease) and the elector around it, on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.controller.ha.lease import Lease, ask, release

pytestmark = pytest.mark.ha

T0 = datetime(2026, 11, 26, 21, 0, tzinfo=UTC)
LENGTH = timedelta(seconds=8)
NOBODY = Lease("", 0, datetime(1970, 1, 1, tzinfo=UTC))


def test_the_first_asker_takes_epoch_1_and_renews_it_without_a_new_epoch() -> None:
    a = ask(NOBODY, "a", "http://a", T0, LENGTH)
    assert a == Lease("a", 1, T0 + LENGTH, "http://a")
    renewed = ask(a, "a", "http://a", T0 + timedelta(seconds=3), LENGTH)
    assert renewed is not None and renewed.epoch == 1 and renewed.expires == T0 + timedelta(seconds=11)


def test_another_replica_gets_nothing_while_the_lease_holds_and_the_next_epoch_after() -> None:
    a = ask(NOBODY, "a", "http://a", T0, LENGTH)
    assert a is not None
    assert ask(a, "b", "http://b", T0 + LENGTH - timedelta(microseconds=1), LENGTH) is None
    b = ask(a, "b", "http://b", T0 + LENGTH, LENGTH)
    assert b == Lease("b", 2, T0 + 2 * LENGTH, "http://b")


def test_a_holder_whose_lease_ran_out_takes_a_new_epoch_it_may_have_missed_writes() -> None:
    a = ask(NOBODY, "a", "", T0, LENGTH)
    assert a is not None
    again = ask(a, "a", "", T0 + LENGTH, LENGTH)
    assert again is not None and again.epoch == 2


def test_release_expires_the_lease_now_and_only_for_its_holder() -> None:
    a = ask(NOBODY, "a", "", T0, LENGTH)
    assert a is not None
    assert release(a, "b", T0) is None
    gone = release(a, "a", T0 + timedelta(seconds=1))
    assert gone is not None and gone.epoch == 1 and not gone.valid_at(T0 + timedelta(seconds=1))
    b = ask(gone, "b", "", T0 + timedelta(seconds=1), LENGTH)
    assert b is not None and b.epoch == 2


def test_a_lease_length_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        ask(NOBODY, "a", "", T0, timedelta(0))


REPLICAS = ["a", "b", "c"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(REPLICAS), st.integers(0, 12_000), st.booleans()), max_size=60))
def test_no_two_replicas_ever_hold_one_epoch_or_overlapping_leases(steps: list[tuple[str, int, bool]]) -> None:
    """Any interleaving of asks and releases by three replicas, at non-decreasing times (the database's
    clock): every epoch has exactly one holder, epochs only grow, and no two holders' leases overlap."""
    lease, now = NOBODY, T0
    holders: dict[int, str] = {}
    held: list[tuple[str, datetime, datetime]] = []  # (holder, from, until) as granted
    for who, ms, give_up in steps:
        now += timedelta(milliseconds=ms)
        new = release(lease, who, now) if give_up else ask(lease, who, "", now, LENGTH)
        if new is None:
            continue
        assert new.epoch >= lease.epoch
        if new.epoch != lease.epoch:
            assert new.epoch == lease.epoch + 1 and new.epoch not in holders
            assert not lease.valid_at(now), "a new epoch was handed out while the last one held"
        assert holders.setdefault(new.epoch, new.holder) == new.holder, f"epoch {new.epoch} has two holders"
        if held and held[-1][0] == new.holder and new.epoch == lease.epoch:
            held[-1] = (new.holder, held[-1][1], new.expires)
        else:
            held.append((new.holder, now, new.expires))
        lease = new
    for (h1, _s1, e1), (h2, s2, _e2) in pairwise(held):
        if h1 != h2:
            assert s2 >= e1, f"{h2} took over at {s2} while {h1} held until {e1}"
