"""A tenancy move with ``[tenancy] wipe = "pxe"``: the reimage is a one-time PXE boot and a power cycle
through the node's BMC — sushy-tools' Redfish emulator, a real HTTP server — then the node's agent
registering again, then validation, then the handover. A controller that dies while asking the BMC
never asks twice: the move fails and the node keeps no tenant."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from gpufleet.controller.executors.bmc import BmcExecutor
from gpufleet.controller.maintenance import Maintenance
from gpufleet.controller.pxe import ASKING
from gpufleet.controller.settings import TenancySettings
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.inventory import NodeInventory
from gpufleet.lifecycle.maintenance import Step
from tests.integration.bmc.emulators import Service, start_emulator
from tests.integration.bmc.test_redfish import PASSWORD, USER, UUID0, assert_no_credentials, bmc_of
from tests.integration.reconciler.test_tenancy_move import TenancyWorld

pytestmark = [pytest.mark.tenancy, pytest.mark.redfish]


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Service]:
    svc = start_emulator(tmp_path / "emulator", {"node0": UUID0}, USER, PASSWORD)
    yield svc
    svc.stop()


class PxeWorld(TenancyWorld):
    settings = TenancySettings(wipe="pxe", validation="quick")
    bmc: BmcExecutor | None = None

    def restart(self) -> None:
        super().restart()
        self.m = Maintenance(self.c, self.s, self.bmc)
        self.m.load()
        self.r.maintenance = self.m
        self.t.maintenance = self.m

    def agent_starts(self, node: str) -> None:
        """What the reimaged node's agent does first: register its inventory."""
        self.c.store.save_inventory(NodeInventory(node, serial="REIMAGED"), self.clock.now())


def _world(tmp_path: Path, emulator: Service) -> PxeWorld:
    w = PxeWorld(f"sqlite:///{tmp_path / 'g.db'}")
    w.bmc = BmcExecutor({w.ids[0]: bmc_of(emulator.url, w.ids[0], UUID0)}, off_wait=10, poll=0.05)
    w.restart()
    return w


def test_a_pxe_wipe_reimages_through_the_bmc_and_hands_over_after_validation(
        tmp_path: Path, emulator: Service, caplog: pytest.LogCaptureFixture) -> None:
    w = _world(tmp_path, emulator)
    node = w.ids[0]
    m = w.t.move(node, "globex", "admin:root")
    for _ in range(6):
        w.step()
    rollout = w.m.store.get(m.rollout).node(node)
    assert rollout.step == Step.ACTION and rollout.command.startswith("pxe-asked:"), rollout
    system = httpx.get(f"{emulator.url}/redfish/v1/Systems/{UUID0}", auth=(USER, PASSWORD), timeout=5).json()
    assert system["Boot"]["BootSourceOverrideTarget"] == "Pxe"
    log = emulator.text()
    assert log.index('power state set to "ForceOff"') < log.index('power state set to "On"'), "power cycled"
    assert w.repairs.pending(node) == [], "nothing on the agent channel: the BMC did it"
    w.step()
    assert w.t.store.get(m.id).state == "running" and w.c.state_of(node) == "repair", "waits for the agent"
    w.clock.advance(timedelta(seconds=5))
    w.agent_starts(node)
    assert w.until(m.id) == "done" and w.t.owner(node) == "globex"
    steps = [a for a, _ in w.audit(node) if a.startswith(("tenancy_", "maintenance_"))]
    assert steps == ["tenancy_move", "maintenance_draining", "maintenance_action", "maintenance_validating",
                     "maintenance_done", "tenancy_handover"]
    assert_no_credentials(caplog.text, str(w.audit(node)))


def test_a_controller_that_died_while_asking_the_bmc_does_not_ask_again(tmp_path: Path, emulator: Service) -> None:
    w = _world(tmp_path, emulator)
    node = w.ids[0]
    m = w.t.move(node, "globex", "admin:root")
    for _ in range(6):
        w.step()
        if w.m.store.get(m.rollout).node(node).step == Step.ACTION:
            break
    # the record a controller killed inside the BMC call leaves behind
    w.m.store.set_step(m.rollout, node, Step.ACTION, "asking the BMC", w.clock.now(), None,
                       command=f"{ASKING}{w.clock.now().isoformat()}")
    w.restart()
    assert w.until(m.id) == "failed" and w.t.owner(node) is None
    assert "not asked again" in w.t.store.get(m.id).detail


def test_a_node_without_a_bmc_fails_the_move_and_keeps_no_tenant(tmp_path: Path, emulator: Service) -> None:
    w = _world(tmp_path, emulator)
    node = w.ids[1]  # no BMC entry
    m = w.t.move(node, "globex", "admin:root")
    assert w.until(m.id) == "failed" and w.t.owner(node) is None
    assert "no BMC" in w.t.store.get(m.id).detail and w.c.state_of(node) == "repair"


def test_a_pxe_rollout_is_refused_at_plan_time_for_a_node_without_a_bmc(tmp_path: Path, emulator: Service) -> None:
    w = _world(tmp_path, emulator)
    with_bmc, without = w.ids[0], w.ids[1]
    r = w.m.plan({"selector": f"nodes:{with_bmc}", "action": "pxe"}, "op")
    assert r.spec.action == "pxe" and [n.node for n in r.nodes] == [with_bmc]
    with pytest.raises(InvalidInput) as err:
        w.m.plan({"selector": f"nodes:{with_bmc},{without}", "action": "pxe"}, "op")
    assert err.value.field == "action" and without in err.value.expected and with_bmc not in err.value.expected
    assert w.c.state_of(without) == w.c.state_of(with_bmc) == "ready"  # nothing was drained
