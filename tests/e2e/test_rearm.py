"""A repair that worked makes the agent look at every standing condition afresh (decision 0132): the wire
from the agent's command poller to its rules, on real processes. An InfiniBand port that went down and is
still down after the ladder's GPU reset (a reset does not touch the HCA) is reported again, so the
controller learns that the repair did not fix everything; kept silent, the node would go back into
service on a validation that never used the port."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from tests.e2e.harness import BASE_POLICY, Fleet, wait_until

pytestmark = pytest.mark.e2e

POLICY = BASE_POLICY.replace("auto_repair = false", "auto_repair = true")
REPAIR = "[repair]\nagent = true\nbundle = false"  # the ladder's GPU reset, queued for the node's agent


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def test_a_port_still_down_after_a_gpu_reset_that_worked_is_reported_again(fleet: Fleet) -> None:
    ctl = fleet.controller(nodes={"n1": "r01"}, policy=POLICY, extra_config=REPAIR)
    # The DBE drains the node and picks the rung (reset_gpu); the port goes down 2 s later, long before
    # the agent's next command poll (every 10 s) runs the reset.
    agent = fleet.agent("n1", "--inject", "ecc_dbe@gpu0", "--inject", "ib_down@nic3@+2")

    def downs() -> list[dict[str, Any]]:
        return sorted((e for e in ctl.api.events(node="n1") if e["attrs"].get("rule") == "ib_down"),
                      key=lambda e: _at(e["time"]))

    def reset() -> list[dict[str, Any]]:
        return [a for a in ctl.api.audit() if a.get("action") == "command_result" and "gpu_reset" in str(a)]

    def step() -> list[dict[str, Any]]:  # written before the command is queued for the agent
        return [a for a in ctl.api.audit() if a.get("action") == "repair_step" and "gpu_reset" in str(a)]

    wait_until(lambda: downs() and reset(), lambda: f"the port down and the GPU reset's result from n1: "
               f"{downs()}, audit {ctl.api.audit()[-8:]}; log:\n{agent.proc.text(4000)}", 60)
    assert "gpu_reset succeeded" in agent.proc.text(), agent.proc.text(4000)
    wait_until(lambda: len(downs()) >= 2, lambda: f"the port reported again after the reset: {downs()}; "
               f"log:\n{agent.proc.text(4000)}", 30)
    one, two = downs()[:2]
    assert one["id"] != two["id"] and one["component"] == two["component"] == "n1-nic3"
    # Once before the reset ran (its result reached the controller after it) and once after the command
    # existed: the agent re-arms before it posts the result, so its next tick may come first (no race on
    # that), but never before the ladder queued the command.
    queued, result = min(_at(a["time"]) for a in step()), min(_at(a["time"]) for a in reset())
    assert _at(one["time"]) < result and queued < _at(two["time"]), (one, queued, result, two)
