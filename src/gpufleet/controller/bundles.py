"""Diagnostic bundles: the controller's side (docs/bmc.md#diagnostic-bundles).

When a node enters ``repair`` the repairer queues a ``diagnostic_bundle`` command for its agent *before*
the first repair step (a GPU reset or a reboot destroys the state an RMA asks about) and waits for it
at most ``bundle_timeout``. The agent uploads its part (``agent.bundle``); :meth:`Bundles.accept` adds
the controller's parts and stores the whole with the repair record (``store.bundles``):

* ``checks``: the node's recent check results (``check_failed`` / ``check_passed`` events, 7 days, 200);
* ``events``: the node's other recent health events (the evidence of the repair), 7 days, 200;
* ``bmc_sel``: the BMC's System Event Log excerpt (last ``SEL_EXCERPT`` entries) when the node has a
  BMC configured, else ``skipped``;
* ``repair``: the repair action it belongs to.

The ticket webhook links it (``bundle``: id and URL); ``GET /v1/bundles/{id}`` downloads it (viewer
or above).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from gpufleet.domain.errors import ExternalError, InvalidInput, NotFound

from .bmc.redfish import RedfishBmc
from .service import Controller
from .store.bundles import FORMAT, BundleInfo, BundleStore
from .store.repairs import RepairStore
from .store.repo import Page

log = logging.getLogger(__name__)
SEL_EXCERPT = 200
_RECENT = timedelta(days=7)
_CHECKS = ("check_failed", "check_passed")


class Bundles:
    def __init__(self, controller: Controller, bmcs: Mapping[str, RedfishBmc] | None = None) -> None:
        self.c = controller
        self.store = BundleStore(controller.store)
        self.repairs = RepairStore(controller.store)
        self.bmcs = dict(bmcs or {})

    def accept(self, node: str, command_id: str, agent_part: dict[str, Any]) -> BundleInfo:
        """The agent's upload for capture command ``command_id``: completed and stored (idempotent)."""
        cmd = self.repairs.command(command_id)
        if cmd is None or cmd.node != node:
            raise NotFound("command", command_id)
        if cmd.kind != "diagnostic_bundle":
            raise InvalidInput("command", command_id, "a diagnostic_bundle command")
        existing = self.store.info(command_id)
        if existing is not None:
            return existing
        now = self.c.clock.now()
        action_id = command_id.removesuffix(":bundle")
        doc = {"format": FORMAT, "id": command_id, "node": node, "repair": {"action": action_id},
               "created": now.isoformat(), "agent": agent_part, **self._controller_parts(node, now)}
        summary = "; ".join(f"{k}: {v.get('status', '?')}" for k, v in
                            [(k, agent_part.get(k) or {}) for k in ("nvidia_bug_report", "kernel_log", "nvml")]
                            + [("checks", doc["checks"]), ("bmc_sel", doc["bmc_sel"])])
        info = self.store.put(command_id, node, action_id, doc, now, summary)
        self.c.audit(node, "diagnostic_bundle", f"{command_id}: {info.size} bytes ({summary})", actor_id="repairer")
        return info

    def _controller_parts(self, node: str, now: Any) -> dict[str, Any]:
        since = now - _RECENT
        rows = self.c.store.events(node=node, since=since, page=Page(1000))
        checks = [_event(r) for r in rows if r.kind in _CHECKS][:200]
        others = [_event(r) for r in rows if r.kind not in _CHECKS][:200]
        return {"checks": {"status": "captured", "results": checks},
                "events": {"status": "captured", "events": others},
                "bmc_sel": self._sel(node)}

    def _sel(self, node: str) -> dict[str, Any]:
        bmc = self.bmcs.get(node)
        if bmc is None:
            return {"status": "skipped", "reason": "no BMC configured for this node ([repair] bmc_file)"}
        try:
            entries = bmc.sel_entries()
        except ExternalError as err:
            return {"status": "failed", "reason": str(err)}
        return {"status": "captured", "entries": entries[-SEL_EXCERPT:], "total": len(entries)}


def _event(r: Any) -> dict[str, Any]:
    return {"id": r.id, "time": r.time.isoformat(), "kind": r.kind, "code": r.code, "severity": r.severity,
            "component": r.component, "source": r.source, "message": r.message, "attrs": r.attrs}
