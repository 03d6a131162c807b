"""Finding -> HealthEvent, collateral folding and per-device grouping."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.events import finding_to_event
from gpufleet.diagnose.finding import Finding, FindingKind
from gpufleet.diagnose.grouping import GpuRef
from gpufleet.diagnose.report import analyse, render_table
from gpufleet.domain.catalog import Catalog, load_default_catalog
from gpufleet.domain.events import EventKind, Severity
from gpufleet.domain.judgement import judge_event


def _decode(cat: Catalog, lines: list[str]) -> list[Finding]:
    dec = Decoder(cat, year=2026)
    return [f for ln in lines for f in dec.feed(ln)] + dec.flush()


J = "Nov 21 12:00:{:02d} node7 kernel: "


def test_event_kinds(catalog: Catalog) -> None:
    lines = [
        J.format(1) + "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, DBE detected",
        J.format(2) + "nvidia-nvswitch2: SXid (PCI:0000:c6:00.0): 20034, Fatal, Link 44 LTSSM Fault Up",
        J.format(3) + "pcieport 0000:00:03.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
        J.format(3)
        + "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
        "type=Transaction Layer, (Requester ID)",
        J.format(3) + "nvidia 0000:3b:00.0:    [14] CmpltTO                (First)",
        J.format(4) + "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
        J.format(5) + "mlx5_core 0000:12:00.0: Port module event: module 0, Cable unplugged",
        J.format(6) + "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#0 (channel:0 slot:0)",
        J.format(7) + "Out of memory: Killed process 7 (python3) total-vm:1kB",
    ]
    found = _decode(catalog, lines)
    events = [finding_to_event(f, "r01-n03", id=f"e{f.line}") for f in found]
    assert [e.kind if e else None for e in events] == [
        EventKind.XID,
        EventKind.SXID,
        EventKind.AER_UNCORRECTED,
        EventKind.GPU_LOST,
        EventKind.LINK_ERROR,
        EventKind.CHECK_FAILED,
        None,
    ]
    xid = events[0]
    assert xid is not None
    assert (xid.node, xid.code, xid.component, xid.source) == ("r01-n03", 48, "0000:3b:00.0", "diagnose")
    assert xid.time == datetime(2026, 11, 21, 12, 0, 1, tzinfo=UTC) and xid.severity is None  # stated nothing
    assert judge_event(load_default_catalog(), xid).severity is Severity.FATAL
    aer = events[2]
    assert aer is not None and aer.code == 14 and ("pci", "0000:3b:00.0") in aer.attrs
    sxid = events[1]
    assert sxid is not None and ("port", "44") in sxid.attrs  # a switch port, not a topology link id


def test_gpu_slot_names_the_component_and_missing_time_needs_fallback(catalog: Catalog) -> None:
    (f,) = _decode(catalog, ["[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."])
    assert finding_to_event(f, "n", id="1") is None  # no wall-clock time in plain dmesg
    t = datetime(2026, 11, 21, tzinfo=UTC)
    ev = finding_to_event(f, "n", id="1", gpu_slot="r01-n03-gpu2", fallback_time=t)
    assert ev is not None and ev.component == "r01-n03-gpu2" and ev.time == t


def test_link_down_then_up_then_down_is_a_flap(catalog: Catalog) -> None:
    # Constructed in the mlx5 "Port: %d Link %s" format seen in leptonai/gpud PR #1209.
    lines = [
        J.format(1) + "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN",
        J.format(2) + "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
        J.format(3) + "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN",
    ]
    found = _decode(catalog, lines)
    kinds = [e.kind for f in found if (e := finding_to_event(f, "n", id=str(f.line)))]
    assert kinds == [EventKind.LINK_DOWN, EventKind.LINK_FLAP]


def test_xid45_after_79_is_folded_and_group_takes_worst(catalog: Catalog) -> None:
    lines = [
        J.format(1) + "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=x, GPU has fallen off the bus.",
        J.format(2) + "NVRM: Xid (PCI:0000:3b:00): 45, pid=7, name=python3, Ch 00000010",
        J.format(3) + "NVRM: Xid (PCI:0000:5d:00): 45, pid=8, name=python3, Ch 00000010",
    ]
    dec = Decoder(catalog, year=2026)
    found = [f for ln in lines for f in dec.feed(ln)] + dec.flush()
    inv = {"0000:3b:00.0": GpuRef(node="r01-n03", index=2, slot="r01-n03-gpu2")}
    rep = analyse(found, catalog, dec.stats, inv)
    assert [(f.code, f.root_line) for f in rep.findings] == [(79, None), (45, 1), (45, None)]
    first = rep.groups[0]
    assert (first.key, first.severity, first.gpu) == ("0000:3b:00.0", Severity.FATAL, inv["0000:3b:00.0"])
    text = render_table(rep)
    assert "gpu2 r01-n03-gpu2 on r01-n03" in text and text.index("0000:3b:00.0") < text.index("0000:5d:00.0")


def test_sympathetic_94_on_a_neighbour_folds_under_the_first(catalog: Catalog) -> None:
    lines = [
        J.format(1) + "NVRM: Xid (PCI:0000:3b:00): 95, pid=1, name=x, Uncontained ECC error",
        J.format(1) + "NVRM: Xid (PCI:0000:5d:00): 94, pid=1, name=x, Contained ECC error",
        J.format(59) + "NVRM: Xid (PCI:0000:9a:00): 94, pid=1, name=x, Contained ECC error",
    ]
    dec = Decoder(catalog, year=2026)
    found = [f for ln in lines for f in dec.feed(ln)] + dec.flush()
    rep = analyse(found, catalog, dec.stats)
    assert [f.root_line for f in rep.findings] == [None, 1, 1]
    assert len(rep.groups) == 1 and rep.groups[0].key == "0000:3b:00.0"


def test_finding_to_dict_has_the_documented_fields(catalog: Catalog) -> None:
    (f,) = _decode(catalog, [J.format(1) + "NVRM: Xid (PCI:0000:3B:00): 79, GPU has fallen off the bus."])
    d = f.to_dict()
    assert {
        "kind",
        "code",
        "pci",
        "pci_raw",
        "time",
        "severity",
        "action",
        "meaning",
        "component",
        "line",
        "raw",
    } <= set(d)
    assert (d["kind"], d["pci"], d["pci_raw"], d["line"]) == ("xid", "0000:3b:00.0", "0000:3B:00", 1)
    assert f.kind is FindingKind.XID
