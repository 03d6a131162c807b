"""The BMC executor: the power-cycle rung of the repair ladder, out of band through Redfish (docs/bmc.md).

``start`` powers the node off (``ForceOff``), waits until the BMC reports ``Off`` (at most
``off_wait``), then powers it on; ``outcome`` is the power state: ``On`` = done (the node boots and is
validated next), anything else = still going (``step_timeout`` ends it). Each half is observable, where
a single ``PowerCycle`` reset is not (and many BMCs do not offer it).

Failure behaviour (the port's contract): an unreachable BMC, a 5xx, a BMC that does not report ``Off``
in time raise :class:`ExternalError`; the repairer retries ``start`` with backoff (``bmc_tries``), then
counts the step as failed and climbs to the next rung (a ticket). Not idempotent across a crash *inside*
``start`` (the key is recorded as sent only after it returns): a controller killed mid-cycle cycles the
node again after its restart — harmless, the node is drained and in repair.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.lifecycle.repair import BMC_STEPS

from ..bmc.redfish import RedfishBmc, Reset
from .port import StepOutcome, StepRequest

log = logging.getLogger(__name__)


class BmcExecutor:
    name = "bmc"

    def __init__(self, bmcs: Mapping[str, RedfishBmc], *, off_wait: float = 60.0, poll: float = 1.0,
                 wait: Callable[[float], None] | None = None) -> None:
        self.bmcs = dict(bmcs)
        self.off_wait, self.poll = off_wait, poll
        self._wait = wait or threading.Event().wait

    def has(self, node: str) -> bool:
        return node in self.bmcs

    def _bmc(self, node: str) -> RedfishBmc:
        bmc = self.bmcs.get(node)
        if bmc is None:
            raise InvalidInput("node", node, "a node with a BMC entry in [repair] bmc_file")
        return bmc

    def start(self, req: StepRequest) -> None:
        if req.step not in BMC_STEPS:
            raise InvalidInput("step", req.step, f"one of {sorted(BMC_STEPS)} (what a BMC can do)")
        self.power_cycle(req.node, req.key)

    def pxe_boot(self, node: str, why: str) -> None:
        """Boot once from PXE (a reimage by the site's provisioning), then power cycle; ExternalError as start."""
        self._bmc(node).boot_once_pxe()
        log.info("%s: next boot from PXE set through the BMC (%s)", node, why)
        self.power_cycle(node, why)

    def power_cycle(self, node: str, why: str) -> None:
        bmc = self._bmc(node)
        log.info("%s: power cycle through the BMC (%s)", node, why)
        if bmc.power_state() != "Off":
            bmc.reset(Reset.FORCE_OFF)
            waited = 0.0
            while bmc.power_state() != "Off":
                if waited >= self.off_wait:
                    raise ExternalError(f"BMC of {node}", f"still not Off {self.off_wait:g} s after ForceOff")
                self._wait(self.poll)
                waited += self.poll
        bmc.reset(Reset.ON)

    def outcome(self, req: StepRequest) -> StepOutcome | None:
        try:
            state = self._bmc(req.node).power_state()
        except ExternalError as err:
            log.warning("%s: BMC unreachable while following %s: %s", req.node, req.key, err)
            return None  # step_timeout ends it
        return StepOutcome(True, "power cycled through the BMC: power On") if state == "On" else None

    def abandon(self, req: StepRequest) -> StepOutcome | None:
        got = self.outcome(req)
        return got if got is not None else StepOutcome(False, "the BMC never reported power On")
