"""Issue #15 families beyond the fixture files: address forms, NVLink5 subcodes, interleaved SXid detail
lines, OOM reports that end at the constraint line, and what reaches the controller as an event."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.events import finding_to_event
from gpufleet.diagnose.finding import Finding, FindingKind
from gpufleet.domain import nvlink5
from gpufleet.domain.catalog import Action, Catalog
from gpufleet.domain.events import EventKind, Severity
from gpufleet.domain.judgement import judge

# Real lines (sources in tests/fixtures/kernel-logs/manifest.toml unless named here).
GB200_149 = ("[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
             "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
SXID_A = [  # NVSwitch README (index id 33251897520)
    "[   60.006338] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 55 Minion Link "
    "DLREQ interrupt",
    "[   60.008040] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Severity 0 Engine instance 55 "
    "Sub-engine instance 00",
]
SXID_B = [  # NVSentinel sxid_handler_test.go (header); the Severity line is ours, in the driver's form
    "[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error "
    "(First)",
    "[ 1108.858290] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Severity 5 Engine instance 28 "
    "Sub-engine instance 00",
]


def _decode(lines: list[str], catalog: Catalog | None) -> list[Finding]:
    dec = Decoder(catalog, year=2025)
    out: list[Finding] = []
    for ln in lines:
        out += dec.feed(ln)
    return out + dec.flush()


@pytest.mark.parametrize("inside", ["PCI:XXXX:XX:XX", "", "redacted", "PCI:<gpu>"])
def test_a_redacted_or_missing_address_reports_the_xid_against_the_node(inside: str, catalog: Catalog) -> None:
    found = _decode([f"NVRM: Xid ({inside}): 79, pid=1, GPU has fallen off the bus."], catalog)
    assert [(f.kind, f.code, f.pci) for f in found] == [(FindingKind.XID, 79, None)]
    ev = finding_to_event(found[0], "n1", id="e1", fallback_time=datetime(2026, 1, 1, tzinfo=UTC))
    assert ev is not None and ev.kind is EventKind.XID and ev.component is None and ev.attr("address") == (
        inside or "none")


def test_mig_instance_is_kept_and_the_gpu_is_the_physical_one(catalog: Catalog) -> None:
    found = _decode(["NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception"],
                    catalog)
    assert found[0].pci == "0000:3b:00.0"
    assert (found[0].get("gpu_instance"), found[0].get("compute_instance")) == ("01", "02")


def test_the_gb200_link_down_names_the_peer_as_the_source(catalog: Catalog) -> None:
    (f,) = _decode([GB200_149], catalog)
    # intrinfo 0x021425c6: bits 0-9 = 0b0111000110 (NETIR_LINK_EVT, pre-R575 layout), bits 20-25 = 0b100001.
    assert (f.get("subcode"), f.get("suspect"), f.severity) == ("33", "peer", Severity.FATAL)
    ev = finding_to_event(f, "n1", id="e1", fallback_time=datetime(2026, 1, 1, tzinfo=UTC))
    assert ev is not None and ev.attr("suspect") == "peer" and ev.attr("nvlink") == "1"
    assert ev.severity is Severity.FATAL  # stated by the subcode row; the controller judges it once


def test_the_subcode_table_settles_a_fatal_word_it_calls_non_fatal(catalog: Catalog) -> None:
    # The BER-event row of NVIDIA's sheet is Non-fatal/IGNORE whatever word the line carries: the line
    # states info, and the row's own catalog entry judges it info, not fatal (decision 0031).
    line = ("NVRM: Xid (PCI:0000:04:00): 149, NETIR_BER_EVENT Fatal XC0 i0 Link 00 "
            "(0x00000013 0x00000001 0x00000000 0x00000000)")
    (f,) = _decode([line], catalog)
    assert (f.stated, f.severity, f.action, f.get("suspect")) == (Severity.INFO, Severity.INFO, Action.NONE, "cable")
    assert f.get("nvl5_row") == "NETIR_BER_EVENT:0x00000001:000000"
    (raw,) = _decode([line], None)  # the agent decodes without a catalog: only what the line states
    assert raw.severity is Severity.INFO


def test_an_unknown_subcode_falls_back_to_the_lines_word(catalog: Catalog) -> None:
    base = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP {w} XC0 i0 Link 00 (0x00000004 0x00004000 0x0 0x0)"
    fatal, nonfatal = (_decode([base.format(w=w)], catalog)[0] for w in ("Fatal", "Nonfatal"))
    assert (fatal.severity, nonfatal.severity) == (Severity.FATAL, Severity.DEGRADED)


def test_both_intrinfo_layouts_reach_the_same_row() -> None:
    v1 = nvlink5.decode(149, "NETIR_LINK_EVT", [0x021425C6, 0])  # pre-R575: unit in bits 0-9
    v2 = nvlink5.decode(149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", [0x02100011, 0])  # R575+: bits 0-6
    assert v1 is not None and v1 == v2 and v1.suspect == "peer"
    assert nvlink5.decode(149, "NETIR_LINK_EVT", [0x021425C6]) is None  # no error-status word


def test_every_shipped_subcode_row_is_well_formed() -> None:
    rows = [r for rs in nvlink5.rules().values() for r in rs]
    assert {r.xid for r in rows} == set(range(144, 151))
    assert all(len(r.v1) == len(r.v2) == 32 and set(r.v1 + r.v2) <= set("01-") for r in rows)
    assert all(r.stated in (Severity.FATAL, Severity.INFO) for r in rows)


def test_detail_lines_of_interleaved_switches_join_their_own_header(catalog: Catalog) -> None:
    found = _decode([SXID_A[0], SXID_B[0], SXID_A[1], SXID_B[1]], catalog)
    assert [(f.line, f.code, f.pci) for f in found] == [(1, 22013, "0000:0a:00.0"), (2, 24007, "0000:c3:00.0")]
    assert found[0].get("severity_detail").startswith("Severity 0") and "Engine instance 55" in found[0].raw
    assert found[1].get("severity_detail").startswith("Severity 5") and found[1].severity is Severity.FATAL


def test_an_oom_report_that_ends_at_the_constraint_line_is_still_an_oom_kill(catalog: Catalog) -> None:
    # equinor/ert#7797 (dmesg --time-format iso), cut after the constraint line.
    line = ("2024-04-29T14:55:41,679685+02:00 oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
            "mems_allowed=0,global_oom,task_memcg=/user.slice/user-21417.slice/user@21417.service,task=perl,"
            "pid=1440763,uid=21417")
    (f,) = _decode([line], catalog)
    assert (f.kind, f.get("process"), f.get("pid"), f.get("scope")) == (FindingKind.OOM, "perl", "1440763", "global")


def test_mlx5_port_module_event_without_the_device_prefix(catalog: Catalog) -> None:
    (f,) = _decode(["[  412.012345] Port module event: module 0, Cable unplugged"], catalog)
    assert (f.kind, f.get("event"), f.pci) == (FindingKind.IB_LINK, "cable", None)


def test_kernel_events_reach_the_controller_and_peermem_stays_a_record(catalog: Catalog) -> None:
    panic, peermem = _decode([
        "<0>[12348.901234] Kernel panic - not syncing: VFS: Unable to mount root fs",
        "[Fri Aug 30 11:11:22 2024] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, "
        "skipping further processing",
    ], catalog)
    t = datetime(2026, 1, 1, tzinfo=UTC)
    ev = finding_to_event(panic, "n1", id="e1", fallback_time=t)
    assert ev is not None and ev.kind is EventKind.CHECK_FAILED and ev.attr("check") == "host_kernel"
    assert judge(catalog, ev.kind.value, None, stated=ev.severity, rule=ev.attr("rule")).severity is Severity.FATAL
    assert (peermem.severity, finding_to_event(peermem, "n1", id="e2", fallback_time=t)) == (Severity.INFO, None)


def test_xid_173_is_in_the_shipped_catalog(catalog: Catalog) -> None:
    entry = catalog.lookup("xid", 173)
    assert catalog.known("xid", 173) and entry.name == "C2C_FATAL_LINK_FAILURE" and entry.severity is Severity.FATAL
    assert entry.source
