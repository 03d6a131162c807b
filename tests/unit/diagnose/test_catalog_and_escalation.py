"""Shipped catalogs, operator overrides in TOML, and "N occurrences within T" escalations."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.report import analyse
from gpufleet.domain.catalog import Action, Catalog, load_default_catalog
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.escalation import count_in_window, triggers
from gpufleet.domain.events import Severity


def test_shipped_catalog_has_every_table(catalog: Catalog) -> None:
    kinds = {k for k, _ in catalog.entries}
    assert {
        "xid",
        "sxid",
        "aer_corrected",
        "aer_uncorrected",
        "nvlink",
        "ib_link",
        "mce_edac",
        "oom",
        "gpu_lost",
        "crash_dump",
    } <= kinds
    assert catalog.lookup("sxid", 22003).severity is Severity.FATAL  # Minion Halt: always fatal (D.6)
    assert catalog.lookup("sxid", 11012).severity is Severity.INFO  # SBE: corrected by the switch
    assert catalog.lookup("aer_uncorrected", 5).action is Action.REBOOT  # surprise down
    assert catalog.lookup("xid", 45).collateral
    assert all(e.source for e in catalog.entries.values())


def _journal(code: int, minute: int, pci: str = "0000:3b:00") -> str:
    return (
        f"Nov 21 12:{minute:02d}:00 node7 kernel: NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python3, detail"
    )


def _run(cat: Catalog, lines: list[str]) -> list[tuple[int, Severity, Action, str]]:
    dec = Decoder(cat, year=2026)
    found = [f for ln in lines for f in dec.feed(ln)] + dec.flush()
    return [(f.code or 0, f.severity, f.action, f.escalated) for f in analyse(found, cat, dec.stats).findings]


def test_override_changes_severity_and_action(catalog: Catalog) -> None:
    doc = tomllib.loads(
        '[[override]]\nkind = "xid"\ncode = 13\nseverity = "fatal"\naction = "drain_and_inspect"\n'
    )
    cat = catalog.with_overrides(doc)
    assert _run(catalog, [_journal(13, 0)])[0][1:3] == (Severity.INFO, Action.RESTART_APP)
    assert _run(cat, [_journal(13, 0)])[0][1:3] == (Severity.FATAL, Action.DRAIN_AND_INSPECT)


def test_override_of_an_aer_bit(catalog: Catalog) -> None:
    doc = {
        "override": [{"kind": "aer_corrected", "code": 0, "severity": "degraded", "action": "check_cabling"}]
    }
    lines = [
        "kernel: pcieport 0000:00:1b.2: AER: Correctable error received from 0000:03:04.0",
        "kernel: pcieport 0000:03:04.0: PCIe Bus Error: severity=Correctable, type=Physical Layer, "
        "(Receiver ID)",
        "kernel: pcieport 0000:03:04.0:    [ 0] RxErr",
    ]
    assert _run(catalog.with_overrides(doc), lines)[0][1:3] == (Severity.DEGRADED, Action.CHECK_CABLING)


def test_default_escalation_xid94_twice_in_a_day(catalog: Catalog) -> None:
    out = _run(catalog, [_journal(94, 0), _journal(94, 30)])
    assert [o[1] for o in out] == [Severity.DEGRADED, Severity.FATAL]
    assert out[1][3] == "2 x xid 94 within 1d"


def test_escalation_window_from_toml(catalog: Catalog) -> None:
    doc = tomllib.loads(
        '[[escalation]]\nkind = "xid"\ncode = 13\ncount = 3\nwindow = "10m"\naction = "drain_and_inspect"\n'
    )
    cat = catalog.with_overrides(doc)
    spread = _run(cat, [_journal(13, 0), _journal(13, 8), _journal(13, 19)])  # never 3 within 10 min
    burst = _run(cat, [_journal(13, 0), _journal(13, 4), _journal(13, 9)])
    assert [o[1] for o in spread] == [Severity.INFO] * 3
    assert [o[1] for o in burst] == [Severity.INFO, Severity.INFO, Severity.FATAL]
    assert burst[2][2] is Action.DRAIN_AND_INSPECT


def test_escalation_counts_per_node_with_inventory(catalog: Catalog) -> None:
    from gpufleet.diagnose.grouping import GpuRef

    inv = {"0000:3b:00.0": GpuRef(node="a", index=0), "0000:5d:00.0": GpuRef(node="b", index=0)}
    dec = Decoder(catalog, year=2026)
    lines = [_journal(94, 0, "0000:3b:00"), _journal(94, 5, "0000:5d:00")]
    found = [f for ln in lines for f in dec.feed(ln)] + dec.flush()
    # one 94 on each node: no escalation (and not sympathetic: 5 minutes apart) ...
    assert [f.severity for f in analyse(found, catalog, dec.stats, inv).findings] == [Severity.DEGRADED] * 2
    # ... while without an inventory the log is one node, and the second 94 escalates
    assert [f.severity for f in analyse(found, catalog, dec.stats).findings][1] is Severity.FATAL


def test_bad_override_is_rejected_with_field_and_value(catalog: Catalog) -> None:
    with pytest.raises(InvalidInput) as err:
        catalog.with_overrides({"escalation": [{"kind": "xid", "code": 94, "count": 0, "window": "1h"}]})
    assert err.value.field == "escalation[0].count" and err.value.value == 0


def test_count_in_window_examples() -> None:
    t0 = datetime(2026, 11, 21, tzinfo=UTC)
    times = [t0, t0 + timedelta(hours=5), t0 + timedelta(hours=40), t0 + timedelta(hours=41)]
    assert count_in_window(times, timedelta(hours=24)) == 2
    assert count_in_window(times, timedelta(hours=48)) == 4
    assert count_in_window([], timedelta(hours=1)) == 0
    assert triggers(times, 2, timedelta(hours=24)) == [1, 3]


def test_mixing_datetimes_and_seconds_is_an_input_error() -> None:
    with pytest.raises(InvalidInput):
        count_in_window([datetime(2026, 1, 1, tzinfo=UTC), 5.0], timedelta(hours=1))  # type: ignore[list-item]


@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=40),
    st.floats(min_value=0, max_value=1e5, allow_nan=False),
)
def test_count_in_window_matches_brute_force(times: list[float], window_s: float) -> None:
    window = timedelta(seconds=window_s)
    # the implementation compares seconds as floats; so does the oracle
    w = window.total_seconds()
    brute = max((sum(1 for u in times if t <= u <= t + w) for t in times), default=0)
    assert count_in_window(times, window) == brute


@given(
    st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=40),
    st.integers(min_value=1, max_value=6),
    st.floats(min_value=0, max_value=1e5, allow_nan=False),
)
def test_triggers_fire_exactly_when_count_is_reached(times: list[float], count: int, window_s: float) -> None:
    times = sorted(times)
    window = timedelta(seconds=window_s)
    w = window.total_seconds()
    want = [i for i, t in enumerate(times) if sum(1 for u in times[: i + 1] if t - u <= w) >= count]
    assert triggers(times, count, window) == want


def test_load_default_catalog_is_stable() -> None:
    assert load_default_catalog().entries == load_default_catalog().entries
