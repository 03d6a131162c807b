"""A GPU and an HCA missing after a reboot, end to end on real processes (decision 0133): the agent's
simulated node comes back without GPU slot 3 and HCA slot 2, so NVML numbers the later GPUs one lower and
the driver names the later HCAs one lower. The controller names the later units' events with their own
slots (by the PCI addresses of the node's last complete inventory), judges no move, and reports the two
missing units, which drain the node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import BASE_POLICY, Fleet, TopologyFile, wait_until

pytestmark = pytest.mark.e2e


def test_units_after_a_missing_gpu_and_hca_keep_their_slots_and_the_missing_ones_drain_the_node(
    fleet: Fleet, tmp_path: Path,
) -> None:
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "2")
    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path)
    n = sorted(topo.racks())[0]
    fleet.agent(n)  # every unit there: the node's reference inventory
    full = ctl.api.get(f"/nodes/{n}/inventory")
    assert (len(full["gpus"]), len(full["nics"])) == (8, 8)
    fleet.stop_agent(n)

    # The node reboots without them. The agent's GPU 3 is now the GPU of slot 4, its mlx5_2 the HCA of slot 3.
    agent = fleet.agent(n, "--inject", "xid:13@gpu3", "--inject", "ib_down@nic2",
                        config='sim_absent = ["gpu3", "nic2"]\n')

    def mine() -> list[dict[str, Any]]:
        return ctl.api.events(node=n)

    def rule(r: str) -> list[dict[str, Any]]:
        return [e for e in mine() if e["attrs"].get("rule") == r]

    wait_until(lambda: rule("gpu_missing") and rule("hca_missing") and rule("ib_down")
               and [e for e in mine() if e["kind"] == "xid" and e["code"] == 13],
               lambda: f"the missing units and the agent's events from {n}: {mine()}; log:\n{agent.proc.text(4000)}")
    (gpu,), (hca,) = rule("gpu_missing"), rule("hca_missing")
    assert (gpu["kind"], gpu["component"], gpu["source"]) == ("gpu_lost", f"{n}-gpu3", "controller")
    assert gpu["attrs"]["pci_expected"] == full["gpus"][3]["pci"]
    assert (hca["kind"], hca["component"]) == ("check_failed", f"{n}-nic2")
    assert hca["attrs"]["pci_expected"] == full["nics"][2]["pci"]
    (xid,) = [e for e in mine() if e["kind"] == "xid" and e["code"] == 13]
    assert xid["component"] == f"{n}-gpu4", xid  # not slot 3: its GPU is not there
    (down,) = rule("ib_down")
    (cable,) = topo.links_of(f"{n}-nic3", "ib")
    assert (down["component"], down["link"]) == (f"{n}-nic3", cable["id"]), down
    assert ctl.api.events(kind="moved") == []  # the shifted numbering is no move

    wait_until(lambda: ctl.api.node(n)["node"]["state"] != "ready",
               lambda: f"{n} drained for its missing GPU: {ctl.api.node(n)['node']}; {ctl.api.decisions(n)}")


POLICY = BASE_POLICY.replace("auto_repair = false", "auto_repair = true")
REPAIR = "[repair]\nagent = true\nbundle = false"  # the ladder's reboot, queued for the node's agent


def test_a_reboot_that_did_not_bring_the_gpu_back_fails_revalidation_and_the_ladder_climbs(
    fleet: Fleet, tmp_path: Path,
) -> None:
    """The loop: the missing GPU drains the node and the ladder reboots it through its agent. The node goes
    to revalidation, which waits for the host: its agent, starting again still without the GPU, says so,
    and the revalidation fails on that report. The ladder takes its next rung, instead of a node short of
    a GPU going back into service on a validation of the GPUs it still has."""
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "2")
    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path, policy=POLICY, extra_config=REPAIR)
    n = sorted(topo.racks())[0]
    fleet.agent(n)
    fleet.stop_agent(n)
    short = 'sim_absent = ["gpu3"]\n'
    agent = fleet.agent(n, config=short)

    def audit(action: str) -> list[dict[str, Any]]:
        return [a for a in ctl.api.audit() if a.get("action") == action and a.get("target") == n]

    def missing() -> list[dict[str, Any]]:
        return sorted((e for e in ctl.api.events(node=n) if e["attrs"].get("rule") == "gpu_missing"),
                      key=lambda e: e["time"])

    def failed() -> list[dict[str, Any]]:
        return [d for d in ctl.api.decisions(n) if (d["from_state"], d["to_state"]) == ("revalidate", "repair")]

    wait_until(lambda: ctl.api.node(n)["node"]["state"] == "revalidate"
               and [a for a in audit("command_result") if "reboot" in a["detail"]],
               lambda: f"the ladder's reboot run by {n}'s agent: {ctl.api.audit()[-10:]}; "
                       f"log:\n{agent.proc.text(4000)}", 60)
    assert len(missing()) == 1  # not told again before the host is back: the reboot may have brought it back
    fleet.stop_agent(n)
    back = fleet.agent(n, config=short)  # the host is back from the reboot, still without the GPU
    wait_until(lambda: failed() and len(audit("repair_step")) >= 2,
               lambda: f"a failed revalidation and a second rung: {ctl.api.decisions(n)}; "
                       f"audit {audit('repair_step')}; log:\n{back.proc.text(4000)}", 30)
    (again,) = failed()
    told = missing()
    assert len(told) == 2 and told[1]["id"] in {str(x) for x in again["evidence"]}, (told, again)
    assert ctl.api.node(n)["node"]["state"] not in ("ready", "in_service")
