"""Event ids fit the controller's limit whatever the node's name (decision 0129)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.eventids import event_id
from gpufleet.agent.runner import Agent
from gpufleet.agent.spool import Spool
from gpufleet.controller.api.schemas import EventIn
from gpufleet.domain.events import EVENT_ID_MAX, NODE_ID_MAX

T0 = datetime(2026, 12, 7, 12, tzinfo=UTC)
# of every length up to the limit (plain text strategies rarely draw long strings)
names = st.tuples(st.integers(1, NODE_ID_MAX), st.text(st.sampled_from("abcxyz019-."), min_size=1, max_size=9)).map(
    lambda t: (t[1] * NODE_ID_MAX)[:t[0]])
# long keys that differ only past the point where they are cut, and short ones
tails = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
keys = st.tuples(st.integers(0, 36), tails).map(lambda t: "nvlink_err:" * t[0] + t[1])


@given(names, keys, keys, st.integers(0, 10**6))
def test_an_id_fits_the_limit_and_two_keys_of_one_node_never_share_one(node: str, a: str, b: str, us: int) -> None:
    when = T0 + timedelta(microseconds=us)
    ia, ib = event_id(node, a, when), event_id(node, b, when)
    assert len(ia) <= EVENT_ID_MAX and len(ib) <= EVENT_ID_MAX
    assert ia.startswith(f"{node}:") and ia.endswith(f"@{when:%Y%m%dT%H%M%S.%fZ}")
    assert (ia == ib) == (a == b)


def test_an_id_that_fits_is_the_plain_form() -> None:
    assert event_id("n1", "ecc_dbe:n1-gpu0:3", T0) == "n1:ecc_dbe:n1-gpu0:3@20261207T120000.000000Z"


def test_every_event_of_a_node_with_the_longest_name_is_taken_by_the_controller(tmp_path: Path) -> None:
    """The longest name the controller takes, events whose keys repeat it: the API validates them all."""
    node = ("rack-07-tray-12-" * 8)[:NODE_ID_MAX]
    clock = FakeClock()
    dev = SimDevice(2, clock=clock)
    dev.set_row_remap(0, failure=True, pending=True)
    dev.retire_pages(0, dbe=70)
    dev.fall_off_bus(1)
    spool = Spool(tmp_path / "s.db")
    agent = Agent(node, dev, clock, spool=spool)
    agent.open()
    agent.tick()
    bodies = [json.loads(b) for _, b in spool.peek(100)]
    assert {b["kind"] for b in bodies} >= {"row_remap_failure", "row_remap_pending", "ecc_dbe", "gpu_lost"}, bodies
    for body in bodies:
        assert EventIn.model_validate(body).id == body["id"]
        assert body["id"].startswith(f"{node}:")
