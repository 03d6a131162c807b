"""BMC secrets file (controller.bmc.credentials) and SEL entry classification (controller.bmc.sel)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.controller.bmc.credentials import Secret, load_targets
from gpufleet.controller.bmc.sel import classify, entry_event
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind
from gpufleet.domain.judgement import judge

NOW = datetime(2026, 11, 21, 12, tzinfo=UTC)


def write(tmp: Path, text: str, mode: int = 0o600) -> Path:
    p = tmp / "bmc.toml"
    p.write_text(text)
    p.chmod(mode)
    return p


def test_references_are_resolved_and_never_shown(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-a-file\nignored second line\n")
    p = write(tmp_path, f'[defaults]\nusername = "env:BMC_USER"\npassword = "file:{tmp_path / "pw"}"\n'
                       '[nodes.n1]\naddress = "https://10.0.0.11"\n'
                       '[nodes.n2]\naddress = "https://10.0.0.12:8443/"\npassword = "literal-pw"\nsystem = "Self"\n')
    t = load_targets(p, env={"BMC_USER": "svc-gpufleet"})
    assert t["n1"].password.reveal() == "from-a-file" and t["n1"].username.reveal() == "svc-gpufleet"
    assert t["n2"].password.reveal() == "literal-pw" and t["n2"].address == "https://10.0.0.12:8443"
    assert t["n2"].system == "Self"
    shown = f"{t} {t['n1']!r} {t['n2']} {Secret('x')}"
    assert "from-a-file" not in shown and "literal-pw" not in shown and "svc-gpufleet" not in shown


@pytest.mark.parametrize(("text", "mode", "field", "expected"), [
    ('[nodes.n1]\naddress = "https://h"\nusername = "u"\npassword = "p"\n', 0o644, "repair.bmc_file", "chmod 600"),
    ('[nodes.n1]\naddress = "http://h"\nusername = "u"\npassword = "p"\n', 0o600, "nodes.n1.address", "bmc_allow_http"),
    ('[nodes.n1]\naddress = "https://u:p@h"\nusername = "u"\npassword = "p"\n', 0o600, "nodes.n1.address",
     "without credentials"),
    ('[nodes.n1]\naddress = "https://h"\nusername = "u"\n', 0o600, "nodes.n1.password", "non-empty"),
    ('[nodes.n1]\naddress = "https://h"\nusername = "u"\npassword = "env:NOPE_NOT_SET"\n', 0o600,
     "nodes.n1.password", "environment variable"),
    ('[nodes.n1]\naddress = "https://h"\nusername = "u"\npassword = "p"\nport = 1\n', 0o600, "nodes.n1.port",
     "address, username"),
])
def test_bad_entries_name_the_field(tmp_path: Path, text: str, mode: int, field: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_targets(write(tmp_path, text, mode), env={})
    assert err.value.field == field and expected in err.value.expected
    assert '"p"' not in str(err.value) and "u:p@" not in str(err.value)


def test_http_is_allowed_only_when_asked(tmp_path: Path) -> None:
    p = write(tmp_path, '[nodes.n1]\naddress = "http://127.0.0.1:8000"\nusername = "u"\npassword = "p"\n')
    assert load_targets(p, allow_http=True, env={})["n1"].address == "http://127.0.0.1:8000"


def entry(sensor: str, severity: str, message: str = "", code: str = "Assert", eid: str = "7") -> dict[str, object]:
    return {"Id": eid, "Created": "2026-11-21T11:59:00Z", "SensorType": sensor, "Severity": severity,
            "Message": message, "EntryCode": code, "LogService": "SEL"}


@pytest.mark.parametrize(("e", "kind", "rule", "severity"), [
    (entry("Power Supply / Converter", "Critical", "PSU1 failure"), EventKind.CHECK_FAILED, "bmc_psu", "degraded"),
    (entry("Fan", "Warning", "Fan 2 lower critical going low"), EventKind.THERMAL, "bmc_fan", "degraded"),
    (entry("Temperature", "Critical", "Inlet temp upper critical"), EventKind.THERMAL, "bmc_thermal", "degraded"),
    (entry("Memory", "Critical", "Uncorrectable ECC, DIMM A1"), EventKind.CHECK_FAILED, "bmc_memory_ue", "fatal"),
    (entry("Memory", "Warning", "Correctable ECC, DIMM A1"), EventKind.CHECK_FAILED, "bmc_memory_ce", "info"),
    (entry("Critical Interrupt", "Critical", "PCIe fatal error, slot 4"), EventKind.AER_UNCORRECTED,
     "bmc_pcie_fatal", "fatal"),
    (entry("Critical Interrupt", "Warning", "PCIe correctable error"), EventKind.AER_CORRECTED, "bmc_pcie", "info"),
    (entry("", "Critical", "Power supply 2 input lost"), EventKind.CHECK_FAILED, "bmc_psu", "degraded"),
])
def test_hardware_entries_map_to_rules_the_catalog_judges(e: dict[str, object], kind: EventKind, rule: str,
                                                          severity: str) -> None:
    assert classify(e) == (kind, rule)
    ev = entry_event("n1", e, fallback_time=NOW)
    assert ev is not None and ev.kind == kind and ev.attr("rule") == rule and ev.source == "bmc"
    assert ev.severity is None  # the BMC's word is kept in attrs, never stated: the catalog judges
    assert judge(load_default_catalog(), ev.kind, ev.code, rule=rule).severity == severity
    assert ev.time == datetime(2026, 11, 21, 11, 59, tzinfo=UTC)


@pytest.mark.parametrize("e", [
    entry("Power Supply / Converter", "Critical", "PSU1 failure", code="Deassert"),
    entry("Fan", "OK", "Fan 2 back to normal"),
    entry("Watchdog", "Critical", "Watchdog timer expired"),
    entry("OS Boot", "Warning", "boot completed"),
])
def test_deasserts_ok_and_non_hardware_entries_are_not_events(e: dict[str, object]) -> None:
    assert entry_event("n1", e, fallback_time=NOW) is None


def test_the_event_id_is_the_entry_and_its_time() -> None:
    a = entry_event("n1", entry("Fan", "Warning", eid="9"), fallback_time=NOW)
    b = entry_event("n1", entry("Fan", "Warning", eid="9"), fallback_time=NOW)
    reused = entry_event("n1", {**entry("Fan", "Warning", eid="9"), "Created": "2026-11-22T08:00:00Z"},
                         fallback_time=NOW)
    assert a is not None and b is not None and reused is not None
    assert a.id == b.id == "n1:bmc:SEL:9:2026-11-21T11:59:00Z" and reused.id != a.id  # a cleared SEL reuses ids
