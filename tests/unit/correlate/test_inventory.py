"""Serial tracking across moves: units carry their contents; a swap is two moves."""

from __future__ import annotations

from datetime import timedelta

from gpufleet.correlate.inventory import Inventory, MoveRecord
from gpufleet.domain.topology_gen import generate_nvl72
from tests.unit.correlate.helpers import T0


def test_swap_moves_units_with_their_gpus() -> None:
    topo = generate_nvl72(1)
    inv = Inventory(topo)
    x, y = topo.components["r01-ct01"].serial, topo.components["r01-ct02"].serial
    gx = topo.components["r01-ct01-gpu2"].serial
    gy = topo.components["r01-ct02-gpu2"].serial
    inv.move(x, "r01-ct01", "r01-ct02")
    inv.move(y, "r01-ct02", "r01-ct01")
    assert inv.serial_at("r01-ct02") == x and inv.serial_at("r01-ct02-gpu2") == gx
    assert inv.serial_at("r01-ct01") == y and inv.serial_at("r01-ct01-gpu2") == gy


def test_move_to_an_empty_slot_leaves_the_old_one_empty() -> None:
    topo = generate_nvl72(1)
    inv = Inventory(topo)
    g = topo.components["r01-ct05-gpu0"].serial
    inv.move(g, "r01-ct05-gpu0", "r01-ct06-gpu1")
    assert inv.serial_at("r01-ct05-gpu0") is None
    assert inv.serial_at("r01-ct06-gpu1") == g


def test_follows_and_stays_queries() -> None:
    topo = generate_nvl72(1)
    inv = Inventory(topo, memory=timedelta(days=1))
    x = topo.components["r01-ct01"].serial
    inv.move(x, "r01-ct01", "r01-ct09")
    inv.record(MoveRecord(x, "r01-ct01", "r01-ct09", T0, symptoms=3, evidence=(1, 2)))
    assert inv.follows(("r01-ct09-gpu1", "r01-ct09", "r01")) is not None
    assert inv.stays(("r01-ct01",)) is not None
    assert inv.follows(("r01-ct01",)) is None
    inv.forget_before(T0 + timedelta(days=2))
    assert inv.follows(("r01-ct09",)) is None
