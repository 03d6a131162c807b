"""One diagnosis run end to end — decode, escalate, fold, group — and its two renderings."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpufleet.diagnose.decoder import DecoderStats
from gpufleet.diagnose.finding import Finding, FindingKind
from gpufleet.diagnose.grouping import GpuRef, Group, escalate, fold, group
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.events import Severity

# Findings kept per (device, kind, code): an AER storm of millions of lines must not fill memory.
# The excess is counted in Report.suppressed; the first ones (the interesting ones) are kept.
KEEP_PER_KEY = 2_000


@dataclass(frozen=True, slots=True)
class Report:
    findings: tuple[Finding, ...]
    groups: tuple[Group, ...]
    stats: DecoderStats
    suppressed: int

    @property
    def fatal(self) -> bool:
        return any(f.severity is Severity.FATAL for f in self.findings)


def analyse(
    found: Iterable[Finding],
    catalog: Catalog,
    stats: DecoderStats,
    inventory: Mapping[str, GpuRef] | None = None,
) -> Report:
    """Escalate per node (the inventory says which node a PCI address belongs to; the rest is one
    node), fold collateral findings and group by device."""
    kept: list[Finding] = []
    seen: dict[tuple[str | None, str, int | None], int] = {}
    suppressed = 0
    for f in found:
        key = (f.pci, f.kind.value, f.code)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > KEEP_PER_KEY:
            suppressed += 1
            continue
        kept.append(f)
    inv = inventory or {}
    per_node: dict[str, list[Finding]] = {}
    for f in kept:
        per_node.setdefault(node_of(f, inv), []).append(f)
    escalated = [e for fs in per_node.values() for e in escalate(fs, catalog.escalations)]
    folded = fold(escalated)
    return Report(tuple(folded), tuple(group(folded, inv)), stats, suppressed)


def node_of(f: Finding, inventory: Mapping[str, GpuRef]) -> str:
    """The node a finding belongs to: the inventory's node for its PCI address, else the host its
    syslog/journal line names, else "" (a plain dmesg of one machine)."""
    ref = inventory.get(f.pci) if f.pci else None
    return (ref.node if ref and ref.node else "") or f.get("host")


def render_json(report: Report) -> str:
    """A JSON array of findings (``node``: the inventory's, else the syslog host; ``gpu_index``/``slot``
    when the inventory knows them)."""
    inv = {g.key: g.gpu for g in report.groups if g.gpu is not None}
    rows = []
    for f in report.findings:
        d = f.to_dict()
        ref = inv.get(f.pci or "")
        d["gpu_index"] = ref.index if ref else None
        d["node"] = node_of(f, inv) or None
        d["slot"] = ref.slot if ref else None
        rows.append(d)
    return json.dumps(rows, indent=2, ensure_ascii=False)


_DEVICE = {
    FindingKind.SXID: "NVSwitch",
    FindingKind.AER: "PCIe",
    FindingKind.IB_LINK: "NIC",
}


def _label(g: Group) -> str:
    if g.key == "host":
        return f"host {g.host}" if g.host else "host"
    kinds = {f.kind for f in g.findings}
    dev = next((_DEVICE[k] for k in _DEVICE if k in kinds and kinds <= {k}), "GPU")
    if FindingKind.XID in kinds or FindingKind.GPU_LOST in kinds:
        dev = "GPU"
    ref = g.gpu
    parts = [] if ref is None else [f"gpu{ref.index}" if ref.index is not None else "", ref.slot]
    node = ref.node if ref is not None and ref.node else g.host
    parts.append(f"on {node}" if node else "")
    where = "  (" + " ".join(p for p in parts if p) + ")" if any(parts) else ""
    return f"{dev} {g.key}{where}"


def _when(f: Finding) -> str:
    if f.time is not None:
        return f.time.isoformat(timespec="seconds")
    if f.uptime is not None:
        return f"+{f.uptime:.3f}s"
    return "-"


# The fixed columns before a finding's text: indent, line, time, kind, code, severity (see render_table).
_FIXED_COLUMNS = 3 + 6 + 2 + 25 + 1 + 10 + 1 + 6 + 2 + 9 + 1
_MIN_TEXT = 30  # a narrower terminal still gets this much of each finding (lines wrap instead)


def render_table(report: Report, source: str = "", width: int | None = None, zone: str = "UTC") -> str:
    """The default human-readable output: one block per device, worst first, with the action.

    ``width``: the terminal's width; a finding's text is cut (with ``…``) to fit it, never below
    ``_MIN_TEXT`` characters. None: nothing is cut (output to a file or a pipe). ``zone``: how
    timestamps without a zone were read (said in the header when a finding has a clock time)."""
    st = report.stats
    counts = {s: sum(1 for f in report.findings if f.severity is s) for s in Severity}
    lines = [
        f"gpufleet diagnose {source}: {st.lines} lines, {len(report.findings)} findings "
        f"({counts[Severity.FATAL]} fatal, {counts[Severity.DEGRADED]} degraded, "
        f"{counts[Severity.INFO]} info) on {len(report.groups)} devices"
    ]
    notes = [f"{n} {what}" for n, what in (
        (st.binary, "binary lines"), (st.invalid_utf8, "invalid UTF-8 lines"),
        (st.truncated, "truncated lines"),
        (st.undecoded, "Xid/SXid lines not understood (no code or a bad one)"),
        (report.suppressed, "repeated findings not kept"),
    ) if n]
    if notes:
        lines.append("input: " + ", ".join(notes))
    if any(f.time is not None for f in report.findings):
        lines.append(f"times: as written in the log; stamps without a zone (syslog, journal) read as {zone} "
                     "(--tz to change)")
    if not report.groups:
        lines.append("no hardware faults found")
    for g in report.groups:
        lines.append("")
        lines.append(f"{g.severity.value.upper():8} {_label(g)}  action: {g.action.value}")
        lines.append(f"  {'line':>7}  {'time':25} {'kind':10} {'code':>6}  {'severity':9} finding")
        for f in g.findings:
            mark = f"  <- line {f.root_line}" if f.root_line is not None else ""
            esc = f"  [escalated: {f.escalated}]" if f.escalated else ""
            what = f"{f.name}: {f.meaning}" if f.meaning and f.meaning != f.name else f.name
            indent = "  ↳" if f.root_line is not None else "   "
            code = "" if f.code is None else str(f.code)
            lines.append(
                f"{indent}{f.line:>6}  {_when(f):25} {f.kind.value:10} {code:>6}  "
                f"{f.severity.value:9} {_fit(f'{what}{esc}{mark}', width)}"
            )
    return "\n".join(lines)


def _fit(text: str, width: int | None) -> str:
    if width is None:
        return text
    room = max(width - _FIXED_COLUMNS, _MIN_TEXT)
    return text if len(text) <= room else text[: room - 1] + "…"
