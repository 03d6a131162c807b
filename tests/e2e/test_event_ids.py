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


def _missing(ctl: Controller, role: str) -> list[dict[str, Any]]:
    return [e for e in ctl.api.events(node="n1") if e["attrs"].get("rule") == "mount_missing"
            and e["message"].startswith(f"{role} mount ")]


def test_a_restarted_agent_does_not_report_again_a_condition_that_still_stands(fleet: Fleet) -> None:
    """Decision 0132: the agent keeps what it reported in its state directory. A mount still missing after
    a restart on the same boot was reported by the first run; reported again with a new id, it would drain
    the node again (after an operator had put it back on purpose), at every upgrade or crash of the agent."""
    ctl = fleet.controller(nodes={"n1": "r01"})
    mounts = f'mounts = {{ checkpoints = "{fleet.root / "not-mounted" / "ckpt"}" }}\n'
    first = fleet.agent("n1", config=mounts)
    wait_until(lambda: _missing(ctl, "checkpoints"), lambda: f"checkpoints missing from n1; log:\n"
               f"{first.proc.text(4000)}", 30)
    fleet.stop_agent("n1")

    # the second run's DBE comes at a slow tick after its first, which read the mounts: once the DBE is
    # stored, whatever that first tick raised was pushed before it (the spool is sent in order)
    second = fleet.agent("n1", "--inject", "ecc_dbe@gpu0", config=mounts)
    wait_until(lambda: [e for e in ctl.api.events(node="n1") if e["kind"] == "ecc_dbe"],
               lambda: f"the injected DBE from n1; log:\n{second.proc.text(4000)}", 30)
    assert len(_missing(ctl, "checkpoints")) == 1, _missing(ctl, "checkpoints")
    assert "edge(s) kept from the last run on this boot" in second.proc.text()
