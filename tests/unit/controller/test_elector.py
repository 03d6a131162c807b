"""The elector (controller.ha.elector) on a fake clock, over a lease store on a SQLite file."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.controller.ha.elector import Elector, Leadership
from gpufleet.controller.ha.fence import Fence
from gpufleet.controller.ha.lease import Lease
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.lease import LeaseStore

pytestmark = pytest.mark.ha


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return datetime(2026, 11, 26, tzinfo=UTC) + timedelta(seconds=self.t)


@pytest.fixture
def leases(tmp_path: Path) -> LeaseStore:
    engine = make_engine(f"sqlite:///{tmp_path / 'lease.db'}")
    migrate(engine)
    return LeaseStore(engine, now=CLOCK.wall)


CLOCK = Clock()


def replica(leases: LeaseStore, name: str, gains: list[tuple[str, int]]) -> tuple[Leadership, Elector]:
    fence = Fence()
    lead = Leadership(name, fence=fence, _clock=CLOCK.mono)
    el = Elector(leases, lead, fence, lease_s=8, renew_s=2, url=lambda: f"http://{name}",
                 on_gain=lambda epoch: gains.append((name, epoch)), clock=CLOCK.mono)
    return lead, el


def test_one_leads_the_other_follows_then_takes_over_with_the_next_epoch(leases: LeaseStore) -> None:
    gains: list[tuple[str, int]] = []
    a, ea = replica(leases, "a", gains)
    b, eb = replica(leases, "b", gains)
    assert ea.step() and not eb.step()
    assert (a.role, a.epoch, b.role, b.leader_url) == ("leader", 1, "follower", "http://a")
    assert ea.fence.epoch == 1 and eb.fence.epoch is None
    CLOCK.t += 7.9  # a is silent (stopped, or cut off from the database)
    assert a.leading() and not eb.step()
    CLOCK.t += 0.1
    assert not a.leading(), "a leader that could not renew stops leading by its own clock, by the lease's expiry"
    assert eb.step() and b.epoch == 2
    assert gains == [("a", 1), ("b", 2)]
    assert not ea.step() and a.epoch is None and ea.fence.epoch is None and a.leader_url == "http://b"


def test_a_renewing_leader_keeps_its_epoch_and_a_resign_hands_over_at_once(leases: LeaseStore) -> None:
    gains: list[tuple[str, int]] = []
    a, ea = replica(leases, "a", gains)
    b, eb = replica(leases, "b", gains)
    for _ in range(10):
        assert ea.step() and not eb.step()
        CLOCK.t += 2
    assert gains == [("a", 1)]
    ea.resign()
    assert not a.leading() and eb.step() and b.epoch == 2


def test_a_failed_rebuild_does_not_lead_and_is_retried(leases: LeaseStore) -> None:
    tries: list[int] = []

    def gain(epoch: int) -> None:
        tries.append(epoch)
        if len(tries) == 1:
            raise OSError("store unreadable")

    fence = Fence()
    lead = Leadership("a", fence=fence, _clock=CLOCK.mono)
    el = Elector(leases, lead, fence, lease_s=8, renew_s=2, url=lambda: "", on_gain=gain, clock=CLOCK.mono)
    assert not el.step() and not lead.leading()
    assert el.step() and tries == [1, 1]


def test_renew_must_fit_twice_in_a_lease(leases: LeaseStore) -> None:
    with pytest.raises(ValueError, match="renew_s"):
        Elector(leases, Leadership("a"), Fence(), lease_s=4, renew_s=3, url=lambda: "", on_gain=lambda e: None)


class Unreachable(LeaseStore):
    """A lease store whose database stops answering when ``down`` is set."""

    down = False

    def ask(self, me: str, url: str, length: timedelta) -> tuple[Lease, bool]:
        if self.down:
            raise OSError("connection refused")
        return super().ask(me, url, length)


def test_a_leader_cut_off_from_the_database_leads_until_its_lease_would_run_out_then_steps_down(
        tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'lease.db'}")
    migrate(engine)
    leases = Unreachable(engine, now=CLOCK.wall)
    gains: list[tuple[str, int]] = []
    a, ea = replica(leases, "a", gains)
    assert ea.step()
    leases.down = True
    CLOCK.t += 6
    assert ea.step() and a.epoch == 1, "one failed renewal within the lease changes nothing"
    CLOCK.t += 2
    assert not ea.step() and a.epoch is None and ea.fence.epoch is None, "stepped down when the lease ran out"
    leases.down = False
    assert ea.step() and a.epoch == 2 and gains == [("a", 1), ("a", 2)], "back with a new epoch, rebuilt"


def test_a_follower_that_cannot_ask_names_no_leader_once_the_leaders_lease_may_have_run_out(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'lease.db'}")
    migrate(engine)
    leases = Unreachable(engine, now=CLOCK.wall)
    a, ea = replica(leases, "a", [])
    b, eb = replica(leases, "b", [])
    assert ea.step() and not eb.step() and b.leader_url == "http://a"
    leases.down = True  # neither can reach the database: a cannot renew, b cannot learn that
    CLOCK.t += 7.9
    assert not eb.step() and b.leader_url == "http://a", "a's lease may still be valid"
    assert a.leader_url == "http://a"
    CLOCK.t += 0.1
    assert not eb.step() and (a.role, a.leader_url, b.leader_url) == ("follower", None, None)
