"""A node the controller was never told about, on a real path: its agent (a real process) is refused,
says at ERROR what to do and keeps its events spooled; an admin registers the node with `gpufleet fleet
register`; the spooled fault then arrives and the node is drained through the scheduler."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.harness import ADMIN_TOKEN, Fleet, child_env, gpufleet_argv, wait_until

pytestmark = pytest.mark.e2e


def test_an_unregistered_nodes_fault_waits_in_its_spool_until_an_admin_registers_the_node(fleet: Fleet) -> None:
    ctl = fleet.controller(nodes={"n1": "r01"}, unregistered=["n2"])
    agent = fleet.agent("n2", "--inject", "xid:79@gpu0", wait=False)
    wait_until(lambda: "does not know node n2" in agent.proc.text(), lambda: f"the agent's hint; log:\n"
               f"{agent.proc.text(4000)}", 30)
    hint = next(ln for ln in agent.proc.text().splitlines() if "does not know node n2" in ln)
    assert "ERROR" in hint and "gpufleet fleet register n2 --rack RACK" in hint
    assert agent.proc.alive and [e for e in fleet.sim_scheduler_effects() if e[1] == "n2"] == []
    assert "n2" not in {n["id"] for n in ctl.api.get("/nodes")}

    out = subprocess.run(gpufleet_argv("fleet", "--url", ctl.url, "register", "n2", "--rack", "r01", "--ready"),
                         env=child_env({"GPUFLEET_TOKEN": ADMIN_TOKEN}), capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "1 registered, 0 already known", out.stderr

    wait_until(lambda: ctl.api.events(node="n2", kind="xid"), "the spooled XID 79 of n2 at the controller", 60)
    (xid,) = ctl.api.events(node="n2", kind="xid")
    assert xid["code"] == 79 and xid["component"] == "n2-gpu0"
    wait_until(lambda: ctl.api.node_state("n2") in ("draining", "drained"), "n2 drained for its XID 79", 30)
    wait_until(lambda: [e for e in fleet.sim_scheduler_effects() if e[:2] == ("drain", "n2")],
               "the scheduler asked to drain n2", 30)
    assert ctl.api.node_state("n1") in ("ready", "in_service")  # the registered neighbour saw nothing


def test_a_controller_without_nodes_says_how_to_register_them_and_one_with_nodes_does_not(fleet: Fleet) -> None:
    ctl = fleet.controller(nodes={"n1": "r01"})  # the harness registers n1 once the controller answers
    fleet.kill_controller()
    fleet.restart_controller()
    first, restarted = ctl.proc.text().split("\n$ ")[-2:]  # the log holds both runs, each after its "$ argv"
    hint = next(ln for ln in first.splitlines() if "no nodes registered" in ln)
    assert hint.startswith("warning:") and "gpufleet fleet register --topology FILE" in hint
    assert "gpufleet controller on http" in restarted and "no nodes registered" not in restarted
