"""The lease rule, pure: who holds the controller's lease after a replica asks for it at ``now``.

One row holds the lease: its holder (a replica id), its epoch (the fencing token) and when it expires.
A replica asking for it:

* holds it and it has not expired: renews it (same epoch, later expiry);
* finds it expired (or never held): takes it with the NEXT epoch, whoever held it before — itself
  included, since a replica whose lease ran out may have missed writes and must rebuild;
* otherwise: gets nothing, and learns who leads (to forward writes there).

Epochs only grow, and a new epoch is only handed out once the last one has expired: so at any time at
most one replica holds an unexpired lease, and no two replicas ever hold the same epoch. Times are the
database's (``clock_timestamp()``), never a replica's own clock, so clock skew between hosts does not
matter. The SQL around this (``store.lease``) reads and writes the row under ``SELECT ... FOR UPDATE``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str  # the replica id ("" before anyone held it)
    epoch: int  # the fencing token: grows by one with every new holder (0 before anyone held it)
    expires: datetime
    url: str = ""  # where the holder serves the API (followers forward writes there)

    def valid_at(self, now: datetime) -> bool:
        return bool(self.holder) and now < self.expires


def ask(current: Lease, me: str, url: str, now: datetime, length: timedelta) -> Lease | None:
    """The lease after ``me`` asks for it at ``now``: renewed or taken (held by ``me``), or None when
    another replica holds an unexpired lease."""
    if length <= timedelta(0):
        raise ValueError(f"lease length must be positive, got {length}")
    if current.holder == me and current.valid_at(now):
        return replace(current, expires=max(current.expires, now + length), url=url)
    if current.valid_at(now):
        return None
    return Lease(me, current.epoch + 1, now + length, url)


def release(current: Lease, me: str, now: datetime) -> Lease | None:
    """The lease after ``me`` gives it up (a clean shutdown): expired now, so a follower takes it at its
    next try instead of waiting out the lease. None when ``me`` does not hold it."""
    if current.holder != me or not current.valid_at(now):
        return None
    return replace(current, expires=now)
