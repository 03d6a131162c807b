"""Domain values: durations, the fleet inventory, and the shipped catalog."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.catalog import Action, load_default_catalog
from gpufleet.domain.durations import format_duration, parse_duration
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.fleet import Fleet, Node, simulated_fleet


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("10m", 600), ("24h", 86400), ("2d", 172800),
                                               ("1h30m", 5400), ("90", 90), ("1.5h", 5400), ("250ms", 0.25)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "10x", "h", "-5m", "5m3", "1h 2"])
def test_bad_duration_names_field(text: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_duration(text, "policy.window")
    assert err.value.field == "policy.window" and err.value.value == text


@given(st.integers(1, 10**7))
def test_format_then_parse_is_close(seconds: int) -> None:
    td = timedelta(seconds=seconds)
    back = parse_duration(format_duration(td))
    assert abs((back - td).total_seconds()) <= 3600  # two most significant units are kept


def test_catalog_carries_nvidia_facts_and_our_judgement() -> None:
    cat = load_default_catalog()
    e79 = cat.lookup("xid", 79)
    assert e79.severity == Severity.FATAL and e79.action == Action.REBOOT
    assert "docs.nvidia.com" in e79.source and "RESTART_BM" in e79.nvidia_resolution
    assert cat.lookup("xid", 45).collateral
    assert cat.lookup("xid", 13).severity == Severity.INFO
    assert cat.lookup("xid", 94).severity == Severity.DEGRADED
    assert cat.lookup("xid", 99999).severity == Severity.DEGRADED  # unknown codes get looked at
    assert cat.lookup("ecc_dbe", None).severity == Severity.FATAL


def test_catalog_override_is_all_or_nothing() -> None:
    cat = load_default_catalog()
    doc = {"override": [{"kind": "xid", "code": 13, "severity": "fatal"},
                        {"kind": "xid", "code": 31, "severity": "nope"}]}
    with pytest.raises(InvalidInput) as err:
        cat.with_overrides(doc)
    assert err.value.field == "override[1].severity"
    assert cat.lookup("xid", 13).severity == Severity.INFO  # the original is untouched


def test_simulated_fleet_shape_and_domains() -> None:
    fleet = simulated_fleet(32, 4)
    assert len(fleet) == 32 and len(fleet.racks()) == 4
    node = next(iter(fleet))
    assert len(node.gpus) == 8 and len({g.pci for g in node.gpus}) == 8
    assert f"rack:{node.rack}" in node.domains
    members = fleet.domain_members()
    assert all(len(m) == 8 for d, m in members.items() if d.startswith("rack:"))


def test_fleet_rejects_duplicates_and_bad_sizes() -> None:
    with pytest.raises(InvalidInput, match=r"nodes\[1\].id"):
        Fleet.of([Node("a", "r1"), Node("a", "r1")])
    with pytest.raises(InvalidInput, match="racks"):
        simulated_fleet(4, 5)


def test_health_event_needs_an_aware_time() -> None:
    with pytest.raises(ValueError, match="timezone"):
        HealthEvent("e", "n", EventKind.XID, datetime(2026, 1, 1))
    assert HealthEvent("e", "n", EventKind.XID, datetime(2026, 1, 1, tzinfo=UTC)).node == "n"
