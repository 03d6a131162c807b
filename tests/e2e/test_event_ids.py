"""Event ids across the seam: a fault reported after a counter started again from zero is stored by the
controller, not refused as a reused id and dropped by the agent (decision 0129).

A restarted simulated node starts its counters at zero, as a rebooted node's volatile counters or a
replaced board's do. The same fault injected again brings them back to the same totals.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import Controller, Fleet, wait_until

pytestmark = pytest.mark.e2e

RULES = ("nvlink_errors", "dbe_increase", "remap_pending")  # what the two faults below raise on gpu0
FAULTS = ("--inject", "nvlink_errors:150@gpu0.nvlink3", "--inject", "ecc_dbe@gpu0")
REFUSED = "the controller rejected"  # the agent's ERROR line when it drops an event the controller refused


def _reported(ctl: Controller) -> dict[str, list[dict[str, Any]]]:
    """n1's stored events of each rule in RULES."""
    events = ctl.api.events(node="n1")
    return {rule: [e for e in events if e["attrs"].get("rule") == rule] for rule in RULES}


def test_a_fault_at_the_same_counter_totals_after_a_reset_is_stored_not_refused(fleet: Fleet) -> None:
    ctl = fleet.controller(nodes={"n1": "r01"})
    first = fleet.agent("n1", *FAULTS)
    wait_until(lambda: all(_reported(ctl).values()), lambda: f"each of {RULES} from n1: {_reported(ctl)}", 30)
    fleet.stop_agent("n1")

    second = fleet.agent("n1", *FAULTS)  # the same node, its counters from zero again, the same faults
    wait_until(lambda: all(len(v) == 2 for v in _reported(ctl).values()) or REFUSED in second.proc.text(),
               lambda: f"a second event of each of {RULES}: {_reported(ctl)}; log:\n{second.proc.text(4000)}", 30)
    assert REFUSED not in first.proc.text() + second.proc.text()
    for rule, stored in _reported(ctl).items():
        assert len(stored) == 2 and stored[0]["id"] != stored[1]["id"], (rule, stored)
        assert stored[0]["time"] != stored[1]["time"] and stored[0]["message"] == stored[1]["message"], (rule, stored)
