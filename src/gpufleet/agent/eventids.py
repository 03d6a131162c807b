"""The ids of the events the agent raises itself (passive checks, XIDs from NVML, idle GPUs).

An event id is the controller's idempotency key per node: the same ``(node, id)`` with the same payload is
a duplicate (a resend from the spool), with another payload a refusal (409) whose event the agent then
drops. So an id must name one event and only one, and a resend must carry the id the event was made with.

The id is ``<node>:<key>@<time>``: ``key`` says what was seen (``ecc_dbe:<node>-gpu0:3``: the rule, the
component, a counter's total or the state that fired), ``time`` *when*, in UTC to the microsecond
(``20261207T120030.000000Z``). What was seen alone is not enough: a counter starts again from 0 after a
GPU reset, a driver reload, a reboot, an HCA reset or a replaced board, so its totals repeat; an edge goes
off and on again (within one second, too, at a cadence under a second); after a reboot or a repair the
agent reports a condition that still holds again (decision 0132). One rule reads one component once per tick, so the
key and its time name one observation. The id is made once, with the event; the spool keeps the event as
it was made and every resend carries that id (decision 0129).

An id fits the controller's limit (``EVENT_ID_MAX`` characters): past it, the key keeps its head and
ends in ``~`` and a digest of the whole key, so a long node name (up to ``NODE_ID_MAX``) still has
distinct ids for distinct keys (decision 0129).

The kernel-log follower's ids are not made here: they come from the record itself (the boot and the
kernel's sequence number, ``collectors/kmsg.py``), so that re-reading the ring after a restart yields the
same ids for the same lines.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from gpufleet.domain.events import EVENT_ID_MAX, utc

_DIGEST = 16  # hex characters of the key's digest when the key is cut


def event_id(node: str, key: str, when: datetime) -> str:
    """``<node>:<key>@<when>``, ``when`` in UTC to the microsecond:
    ``n1:ecc_dbe:n1-gpu0:3@20261207T120030.000000Z``; the key cut to ``<head>~<digest>`` when the whole
    would be longer than ``EVENT_ID_MAX``."""
    stamp = f"{utc(when):%Y%m%dT%H%M%S.%fZ}"
    room = EVENT_ID_MAX - len(node) - len(stamp) - 2  # ":" and "@"
    if len(key) > room:
        digest = hashlib.sha256(key.encode()).hexdigest()[:_DIGEST]
        key = f"{key[:max(0, room - _DIGEST - 1)]}~{digest}"
    return f"{node}:{key}@{stamp}"
