"""Leader election: each replica asks for the lease every ``renew_s``; the one holding it leads.

:class:`Leadership` is what the rest of the controller asks ("do I lead? where is the leader?").
:class:`Elector` keeps it true, in its own thread:

* **gaining** the lease (a new epoch): the fence is armed with the epoch first, then memory is rebuilt
  from the store (``on_gain``: the controller's ``rebuild``, the maintenance runner, the reconciler), and
  only then does the replica lead — so its decisions start from everything the last leader committed.
* **renewing**: the replica leads until ``lease_s`` after it *started* its last successful renewal (the
  database's expiry is later than that), so it stops acting before anyone can take over, even when the
  database is unreachable and it cannot learn that it lost.
* **losing** it (another holder, or the local deadline passed): the fence is disarmed at once (nothing
  it writes lands) and the replica follows.

On SQLite there is no election: :func:`always_leading` is a Leadership that always leads (one replica).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from ..failurelog import FailureLog
from ..store.db import brief
from ..store.lease import LeaseStore
from .fence import Fence

log = logging.getLogger(__name__)


@dataclass
class Leadership:
    """This replica's part: ``leading()`` is what gates the leader's work and the API's forwarding."""

    replica: str
    elected: bool = True  # False: no election (SQLite), this replica always leads
    epoch: int | None = None  # the lease epoch this replica leads with (None: it follows)
    _leader: str = ""  # where the lease holder serves the API, as this replica last learned it
    _leader_until: float = 0.0  # time.monotonic() after which that holder's lease may have run out
    ready: bool = False  # memory rebuilt for ``epoch``
    deadline: float = 0.0  # time.monotonic() after which this replica stops leading without a renewal
    changes: int = 0  # how many times it gained or lost the lead (tests poll this)
    fence: Fence | None = None  # what refuses this replica's writes when it does not lead (None: SQLite)
    _clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def leading(self) -> bool:
        if not self.elected:
            return True
        return self.ready and self.epoch is not None and self._clock() < self.deadline

    @property
    def role(self) -> str:
        return "leader" if self.leading() else "follower"

    @property
    def leader_url(self) -> str | None:
        """Where the leader serves the API, or None while nobody is known to lead: the lease was never
        taken, it ran out (its holder could not renew it, or this replica cannot ask the database), or
        this replica holds it but does not lead yet (rebuilding). Also None without an election (SQLite:
        this replica answers everything itself)."""
        if self.epoch is not None:  # this replica holds the lease: it is the leader while it leads
            return (self._leader or None) if self.leading() else None
        return (self._leader or None) if self._clock() < self._leader_until else None

    def learned(self, url: str, until: float) -> None:
        """The lease's holder serves at ``url`` ("": none) and its lease runs out by ``until`` at the latest."""
        self._leader, self._leader_until = url, until


def always_leading(replica: str = "single") -> Leadership:
    """The only replica (SQLite): always the leader, epoch 0, nothing to fence."""
    return Leadership(replica, elected=False, epoch=0, ready=True)


class Elector:
    def __init__(self, leases: LeaseStore, leadership: Leadership, fence: Fence, *, lease_s: float,
                 renew_s: float, url: Callable[[], str], on_gain: Callable[[int], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 < renew_s * 2 <= lease_s:
            raise ValueError(f"renew_s ({renew_s}) must be positive and at most half of lease_s ({lease_s})")
        self.leases, self.leadership, self.fence = leases, leadership, fence
        self.lease = timedelta(seconds=lease_s)
        self.lease_s, self.renew_s = lease_s, renew_s
        self.url = url
        self.on_gain = on_gain
        self._clock = clock
        self._asking = FailureLog(log, "leader lease: asking for it", level=logging.WARNING)

    def step(self) -> bool:
        """One try at the lease; whether this replica leads after it."""
        me = self.leadership
        started = self._clock()
        try:
            lease, mine = self.leases.ask(me.replica, self.url(), self.lease)
        except Exception as err:
            if me.epoch is not None and started >= me.deadline:
                self._lose(f"could not renew the lease before it ran out ({brief(err)})")
            self._asking.failed(err, f"; trying again every {self.renew_s:.1f} s", trace=False)
            return me.leading()
        self._asking.ok()
        if not mine:
            if me.epoch is not None:
                self._lose(f"replica {lease.holder} holds the lease at epoch {lease.epoch}")
            # the holder renewed at most lease_s before it expires, and before this ask began: so its
            # lease runs out by started + lease_s (unless it renews; the next step learns that)
            me.learned(lease.url if lease.holder else "", started + self.lease_s)
            return False
        me.learned(lease.url, started + self.lease_s)
        if lease.epoch != me.epoch or not me.ready:
            self._gain(lease.epoch)
        if me.epoch == lease.epoch and me.ready:
            me.deadline = started + self.lease_s
        return me.leading()

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # never let the election thread die
                log.exception("leader election step failed")
            stop.wait(self.renew_s)
        self.resign()

    def resign(self) -> None:
        """A clean shutdown: stop leading and give the lease up, so a follower takes over at once."""
        me = self.leadership
        if me.epoch is None:
            return
        self._lose("shutting down")
        try:
            self.leases.release(me.replica)
        except Exception as err:
            log.warning("leader lease: could not release it (%s); it runs out by itself", brief(err))

    def _gain(self, epoch: int) -> None:
        me = self.leadership
        me.ready = False
        me.epoch = self.fence.epoch = epoch
        log.warning("leader lease: won epoch %d; rebuilding state from the store", epoch)
        t0 = time.perf_counter()
        try:
            self.on_gain(epoch)
        except Exception as err:
            log.error("leader lease: rebuilding state for epoch %d failed (%s); trying again at the next renewal",
                      epoch, brief(err))
            return
        me.ready = True
        me.changes += 1
        log.warning("leader lease: leading at epoch %d (state rebuilt in %.2f s)", epoch, time.perf_counter() - t0)

    def _lose(self, why: str) -> None:
        me = self.leadership
        was = me.epoch
        me.ready = False
        me.epoch = self.fence.epoch = None
        me.deadline = 0.0
        me.learned("", 0.0)  # whoever leads next is learned from the lease, not assumed
        me.changes += 1
        log.warning("leader lease: stepped down from epoch %s: %s", was, why)
