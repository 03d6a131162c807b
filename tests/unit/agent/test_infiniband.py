from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.agent.collectors.infiniband import COUNTERS, InfinibandCollector, parse_rate, parse_state

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


def test_healthy_tree_reads_eight_ndr_ports_and_skips_roce() -> None:
    ports = InfinibandCollector(FIX / "h100-healthy").read()
    assert [p.device for p in ports] == [f"mlx5_{i}" for i in range(8)]
    for p in ports:
        assert (p.port, p.state, p.state_id, p.phys_state) == (1, "ACTIVE", 4, "LinkUp")
        assert p.rate_gbps == 400.0 and p.link_layer == "InfiniBand" and p.active
        assert all(p.counter(c) == 0 for c in COUNTERS)


def test_hcas_are_numbered_by_the_value_of_their_number(tmp_path: Path) -> None:
    """Twelve HCAs, as on a DGX H100: ``nic<k>`` is the k-th by number (mlx5_10 is the eleventh, not the
    third), in the readings and in the inventory the controller maps them by."""
    root = tmp_path / "ib"
    names = [f"mlx5_{i}" for i in (11, 3, 10, 0, 2, 1, 9, 4, 8, 5, 7, 6)]
    for name in names:
        shutil.copytree(FIX / "h100-healthy" / "mlx5_0", root / name)
    shutil.copytree(FIX / "h100-healthy" / "mlx5_bond_0", root / "mlx5_bond_0")
    collector = InfinibandCollector(root, include_ethernet=True)
    want = [f"mlx5_{i}" for i in range(12)] + ["mlx5_bond_0"]
    assert [p.device for p in collector.read()] == want
    assert [n.device for n in collector.identities()] == want


def test_ethernet_ports_can_be_included() -> None:
    ports = InfinibandCollector(FIX / "h100-healthy", include_ethernet=True).read()
    bond = [p for p in ports if p.device == "mlx5_bond_0"]
    assert len(bond) == 1 and bond[0].link_layer == "Ethernet" and bond[0].rate_gbps == 200.0


def test_degraded_tree() -> None:
    by = {p.device: p for p in InfinibandCollector(FIX / "h100-degraded").read()}
    assert (by["mlx5_2"].state, by["mlx5_2"].phys_state, by["mlx5_2"].active) == ("DOWN", "Disabled", False)
    assert by["mlx5_2"].counter("link_downed") == 3
    assert by["mlx5_5"].rate_gbps == 200.0 and by["mlx5_5"].counter("link_error_recovery") == 4
    six = by["mlx5_6"]
    assert six.counter("symbol_error") == 65535 and six.counter("port_rcv_errors") == 1289
    assert six.counter("excessive_buffer_overrun_errors") == 7 and six.counter("link_downed") == 255


def test_missing_root_and_unreadable_files_are_none(tmp_path: Path) -> None:
    assert InfinibandCollector(tmp_path / "absent").read() == []
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy" / "mlx5_0", root / "mlx5_0")
    (root / "mlx5_0/ports/1/counters/symbol_error").unlink()
    (root / "mlx5_0/ports/1/counters/link_downed").write_text("garbage\n")
    (root / "mlx5_0/ports/1/rate").unlink()
    [p] = InfinibandCollector(root).read()
    assert p.counter("symbol_error") is None and p.counter("link_downed") is None and p.rate_gbps is None
    assert p.active


def test_counters_are_reread_each_time(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy", root)
    c = InfinibandCollector(root)
    assert c.read()[3].counter("symbol_error") == 0
    (root / "mlx5_3/ports/1/counters/symbol_error").write_text("42\n")
    assert c.read()[3].counter("symbol_error") == 42


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("400 Gb/sec (4X NDR)", 400.0),
        ("200 Gb/sec (4X HDR)", 200.0),
        ("2.5 Gb/sec (1X SDR)", 2.5),
        ("", None),
        ("fast", None),
    ],
)
def test_parse_rate(text: str, want: float | None) -> None:
    assert parse_rate(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("4: ACTIVE", (4, "ACTIVE")),
        ("1: DOWN", (1, "DOWN")),
        ("5: LinkUp", (5, "LinkUp")),
        ("", (None, "")),
        ("ACTIVE", (None, "ACTIVE")),
    ],
)
def test_parse_state(text: str, want: tuple[int | None, str]) -> None:
    assert parse_state(text) == want
