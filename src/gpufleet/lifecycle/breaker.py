"""The blast-radius breaker: automation never takes more than a budget of the fleet out of service.

Budget: at most ``max_unavailable_fleet`` of all (non-retired) nodes, and at most
``max_unavailable_domain`` of any failure domain (a rack, a leaf switch), may be unavailable or
committed to a drain at once — always at least one node, so a tiny fleet can still heal. When a
decision would exceed it, the breaker trips: that decision and every later one that would take a node
out are held (queued, with the reason in the audit log) until an operator resets the breaker — or
has approved or cancelled every held decision: with none held and the fleet within its budget the
breaker closes (``LifecycleEngine`` after ``approve_held``, ``cancel_held`` and operator actions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class BreakerState:
    tripped: bool = False
    reason: str = ""
    since: datetime | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    max_fleet: float = 0.10
    max_domain: float = 0.25

    def allowed(self, size: int, share: float) -> int:
        return max(1, math.floor(share * size + 1e-9))

    def violation(
        self,
        node: str,
        out: Set[str],
        domains: Mapping[str, frozenset[str]],
        members: Mapping[str, frozenset[str]],
        fleet_size: int,
    ) -> str | None:
        """Why taking ``node`` out (with ``out`` already out or committed) breaks the budget, or None."""
        if node in out:
            return None
        why = self._over("fleet", len(out) + 1, fleet_size, self.max_fleet, "would be")
        for dom in sorted(domains.get(node, frozenset())):
            group = members.get(dom, frozenset())
            why = why or self._over("domain", len(out & group) + 1, len(group), self.max_domain, "would be", dom)
        return why

    def excess(self, out: Set[str], members: Mapping[str, frozenset[str]], fleet_size: int) -> str | None:
        """How the nodes ``out`` (out or committed) are over the budget now, or None when within it."""
        why = self._over("fleet", len(out), fleet_size, self.max_fleet, "are")
        for dom in sorted(members):
            group = members[dom]
            why = why or self._over("domain", len(out & group), len(group), self.max_domain, "are", dom)
        return why

    def _over(self, what: str, count: int, size: int, share: float, verb: str, dom: str = "") -> str | None:
        cap = self.allowed(size, share)
        if count <= cap:
            return None
        where = f" in {dom}" if dom else ""
        return f"{what} budget: {count} of {size} nodes{where} {verb} unavailable (max {cap} = {share:.0%})"
