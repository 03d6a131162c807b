"""What a tenant-scoped token may see and act on (docs/tenancy.md#what-a-tenant-token-sees).

A token with ``tenant = "..."`` (viewer or operator) sees its tenant's nodes only; every route makes
one of these decisions (tests/integration/api/test_auth.py holds the table and fails on a route
without one):

* a route about one node (``/nodes/{node}/...``, an action, a bundle, a job's nodes): **404** for a node
  the tenant does not own — the same answer as for a node that does not exist, so names do not leak;
* a listing: **filtered** to the tenant's nodes (``within`` in the store's queries);
* a fleet-wide route (status, breaker, dry-run switch, maintenance rollouts' changes, time to market,
  cluster goodput, metrics, the web UI): **403** — it is the datacenter team's.

Admins and tokens without a tenant see everything, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from fastapi import HTTPException, status

from gpufleet.controller.service import Controller
from gpufleet.domain.errors import NotFound

from .auth import Caller


class Scope:
    def __init__(self, controller: Controller, owner: Callable[[str], str | None] | None) -> None:
        self.controller = controller
        self.owner = owner or (lambda _node: None)  # no tenancy: a scoped token owns nothing

    def sees(self, caller: Caller, node: str) -> bool:
        return caller.tenant is None or self.owner(node) == caller.tenant

    def node(self, caller: Caller, node: str, what: str = "node") -> None:
        """NotFound (404) unless ``caller`` may see ``node``: as if it did not exist."""
        if not self.sees(caller, node):
            raise NotFound(what, node)

    def within(self, caller: Caller) -> Collection[str] | None:
        """The registered nodes ``caller`` may see (None: every node)."""
        if caller.tenant is None:
            return None
        with self.controller.lock:
            nodes = list(self.controller.engine.nodes)
        return frozenset(n for n in nodes if self.owner(n) == caller.tenant)

    def fleet(self, caller: Caller, what: str) -> None:
        """403 for a tenant-scoped caller: ``what`` is fleet-wide."""
        if caller.tenant is not None:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"token {caller.name!r} is scoped to tenant "
                                f"{caller.tenant!r}: {what} is fleet-wide (a token without a tenant's)")
