"""The ``pxe`` maintenance action: reimage a node by booting it once from PXE through its BMC
(docs/tenancy.md#moving-a-node-the-reprovision-workflow, docs/bmc.md). Used by reprovision moves
(``[tenancy] wipe = "pxe"``) and any rollout with ``action = "pxe"``.

Out of band, so not on the agent command channel: the node's rollout step records each stage in its
``command`` field before acting, and a restarted controller reads it back:

* ``<key>`` (queued by the runner): not asked yet -> record ``pxe-asking:<time>``, ask the BMC for a
  one-time PXE boot and power cycle the node, record ``pxe-asked:<time the cycle finished>``;
* ``pxe-asking:...`` found after a restart: the controller died while asking — whether the BMC did it is
  unknown, so it is **not asked again**: the step fails and the node stays in repair (fail closed: no
  step runs twice);
* ``pxe-asked:T``: done once the node's agent registers its inventory after T (an agent registers it on
  every start, dated by the controller's clock: the reimaged node is up); failed after ``action_timeout``.

A BMC that cannot be reached or refuses fails the step (the node stays in repair, out of service).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from gpufleet.controller.executors.bmc import BmcExecutor
from gpufleet.controller.service import Controller
from gpufleet.controller.store.maintenance import NodeStep, Rollout
from gpufleet.domain.errors import GpufleetError
from gpufleet.lifecycle.maintenance import Step

log = logging.getLogger(__name__)
ASKING, ASKED = "pxe-asking:", "pxe-asked:"
Record = Callable[..., Step]  # (step, detail, command=None) -> the step, written with its audit line


class PxeAction:
    def __init__(self, controller: Controller, bmc: BmcExecutor | None) -> None:
        self.controller, self.bmc = controller, bmc

    def advance(self, r: Rollout, n: NodeStep, key: str, record: Record) -> Step:
        now = self.controller.clock.now()
        stays = "the node stays in repair, out of service"
        if n.command.startswith(ASKING):
            return record(Step.FAILED, f"the controller stopped while asking the BMC for the PXE boot "
                          f"({n.command[len(ASKING):]}): it may have happened, so it is not asked again; {stays}")
        if not n.command.startswith(ASKED):
            if self.bmc is None or not self.bmc.has(n.node):
                return record(Step.FAILED, f"pxe: no BMC for {n.node} in [repair] bmc_file; {stays}")
            record(Step.ACTION, "asking the BMC: boot once from PXE, then power cycle", f"{ASKING}{now.isoformat()}")
            try:
                self.bmc.pxe_boot(n.node, key)
            except GpufleetError as err:
                return record(Step.FAILED, f"pxe through the BMC failed: {err}; {stays}")
            done = self.controller.clock.now()
            return record(Step.ACTION, "PXE boot set and power cycled through the BMC: waiting for the node's "
                          "agent to come back", f"{ASKED}{done.isoformat()}")
        asked = datetime.fromisoformat(n.command[len(ASKED):])
        back = self.controller.store.inventory_registered(n.node)
        if back is not None and back > asked:
            self.controller.repair_succeeded(n.node, "maintenance pxe", r.spec.validate, key)
            return record(Step.VALIDATING, f"reimaged over PXE: its agent is back ({back.isoformat()}); "
                          f"{r.spec.validate} validation before service")
        if now - n.since > r.spec.action_timeout:
            return record(Step.FAILED, f"no agent back within {r.spec.action_timeout} of the PXE boot; {stays}")
        return n.step
