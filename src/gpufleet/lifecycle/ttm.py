"""Time to market: how long nodes take from registration to their first day of work (pure).

Per node, from its registration time and its lifecycle transitions:

* **registered**: when the controller first learned of the node (``POST /v1/nodes``);
* **first ready**: its first entry into ``ready`` or ``in_service``; a node registered directly as
  ready (no burn-in asked for) is first ready at registration and says ``burned_in: false`` — it is
  counted, but never as a fast burn-in;
* **burn-in**: registered → first ready for a node that went through ``burn_in``; **failures found**:
  how often its burn-in (or a revalidation before its first ready) ended anywhere but ready (a repair
  before the node ever took work: hardware that would have failed a job).

Per cluster: the time from the first registration until N % of the registered nodes were first
ready (N = 50, 90, 99, 100 by default), the nodes not ready yet, the failures burn-in found, and the
median burn-in. A retired node that was never ready counts as not ready (it never came to market).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufleet.domain.errors import InvalidInput
from gpufleet.lifecycle.states import NodeState

S = NodeState
READY_STATES = frozenset({S.READY, S.IN_SERVICE})
# states a node passes through before its first ready, where a move to anything but ready is a finding
_PRE_SERVICE_CHECKS = frozenset({S.BURN_IN, S.REVALIDATE})
DEFAULT_SHARES = (50.0, 90.0, 99.0, 100.0)


@dataclass(frozen=True, slots=True)
class Step:
    time: datetime
    from_state: NodeState
    to_state: NodeState


@dataclass(frozen=True, slots=True)
class NodeHistory:
    node: str
    registered: datetime
    state: NodeState  # now
    steps: tuple[Step, ...]  # its transitions, oldest first (those after its first ready are not needed)


@dataclass(frozen=True, slots=True)
class NodeTtm:
    node: str
    registered: datetime
    first_ready: datetime | None
    burned_in: bool  # went through burn_in before its first ready
    failures_found: int
    state: NodeState

    @property
    def ttm(self) -> timedelta | None:
        return None if self.first_ready is None else self.first_ready - self.registered

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "registered": self.registered.isoformat(),
                "first_ready": self.first_ready.isoformat() if self.first_ready else None,
                "ttm_s": None if self.ttm is None else self.ttm.total_seconds(), "burned_in": self.burned_in,
                "failures_found": self.failures_found, "state": self.state.value}


@dataclass(frozen=True, slots=True)
class ClusterTtm:
    nodes: int
    ready: int
    not_ready: tuple[str, ...]
    started: datetime | None  # the first registration
    until_share: tuple[tuple[float, timedelta | None], ...]  # (N %, time from start until N % first ready)
    burned_in: int
    failures_found: int
    median_burn_in: timedelta | None
    per_node: tuple[NodeTtm, ...]

    def as_dict(self, *, per_node: bool = True) -> dict[str, Any]:
        """The JSON form: ``GET /v1/ttm`` and the demo summary's ``ttm`` key."""
        return {
            "nodes": self.nodes, "ready": self.ready, "not_ready": list(self.not_ready),
            "started": self.started.isoformat() if self.started else None,
            "until": [{"share": share, "after_s": None if t is None else t.total_seconds()}
                      for share, t in self.until_share],
            "burned_in": self.burned_in, "failures_found": self.failures_found,
            "median_burn_in_s": None if self.median_burn_in is None else self.median_burn_in.total_seconds(),
            "per_node": [n.as_dict() for n in self.per_node] if per_node else None,
        }


def node_ttm(h: NodeHistory) -> NodeTtm:
    steps = h.steps  # in the order they were written (the store reads them so, and stops at the first ready)
    initial = steps[0].from_state if steps else h.state
    first_ready = h.registered if initial in READY_STATES else None
    burned = failures = 0
    for s in steps:
        if first_ready is not None:
            break
        if s.to_state == S.BURN_IN:
            burned = 1
        if s.from_state in _PRE_SERVICE_CHECKS and s.to_state not in READY_STATES:
            failures += 1
        if s.to_state in READY_STATES:
            first_ready = s.time
    return NodeTtm(h.node, h.registered, first_ready, bool(burned), failures, h.state)


def cluster_ttm(histories: Iterable[NodeHistory], shares: Sequence[float] = DEFAULT_SHARES) -> ClusterTtm:
    for share in shares:
        if not 0 < share <= 100:
            raise InvalidInput("share", share, "a percentage above 0 and at most 100")
    per = sorted((node_ttm(h) for h in histories), key=lambda n: (n.registered, n.node))
    started = min((n.registered for n in per), default=None)
    ready_times = sorted(n.first_ready for n in per if n.first_ready is not None)
    until: list[tuple[float, timedelta | None]] = []
    for share in shares:
        need = math.ceil(len(per) * share / 100) if per else 0
        until.append((share, ready_times[need - 1] - started
                      if started is not None and 0 < need <= len(ready_times) else None))
    burn = [n.ttm for n in per if n.burned_in and n.ttm is not None]
    return ClusterTtm(
        nodes=len(per), ready=len(ready_times), not_ready=tuple(n.node for n in per if n.first_ready is None),
        started=started, until_share=tuple(until), burned_in=sum(1 for n in per if n.burned_in),
        failures_found=sum(n.failures_found for n in per),
        median_burn_in=statistics.median_low(burn) if burn else None, per_node=tuple(per))
