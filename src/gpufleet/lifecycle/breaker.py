"""The blast-radius breaker: automation never takes more than a budget of the fleet out of service.

Budget: at most ``max_unavailable_fleet`` of all (non-retired) nodes, and at most
``max_unavailable_domain`` of any failure domain (a rack, a leaf switch), may be unavailable or
committed to a drain at once — always at least one node, so a tiny fleet can still heal. When a
decision would exceed it, the breaker trips: that decision and every later one that would take a node
out are held (queued, with the reason in the audit log) until an operator resets the breaker.
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
        after = len(out) + 1
        cap = self.allowed(fleet_size, self.max_fleet)
        if after > cap:
            return (f"fleet budget: {after} of {fleet_size} nodes would be unavailable "
                    f"(max {cap} = {self.max_fleet:.0%})")
        for dom in sorted(domains.get(node, frozenset())):
            group = members.get(dom, frozenset())
            n = len(out & group) + 1
            dcap = self.allowed(len(group), self.max_domain)
            if n > dcap:
                return (f"domain budget: {n} of {len(group)} nodes in {dom} would be unavailable "
                        f"(max {dcap} = {self.max_domain:.0%})")
        return None
