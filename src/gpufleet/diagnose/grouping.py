"""After decoding: escalations, collateral folding and the per-GPU grouping the CLI prints.

Collateral rules (each looks back over earlier findings within :data:`WINDOW`, or
:data:`WINDOW_LINES` lines when either finding has no time):

* Xid 45 (channel torn down because of an earlier error) folds under the Xid it names ("caused by
  previous Xid N") on the same GPU, else any GPU; without a name, under the latest root on its GPU.
* Xid 154 (recovery action changed) folds under the latest root Xid on its GPU; its recovery action
  still counts towards the group's severity.
* "fallen off the bus" / probe failures fold under an Xid 79 or an earlier loss of the same GPU
  (and Xid 79 under an earlier fallen-off notice); address-less ones under any loss.
* A crash dump folds under the latest root Xid, SXid or loss.
* Xid 94/95 on one GPU shortly after Xid 48/94/95 on another GPU are sympathetic reports (NVIDIA's
  catalog: "IGNORE (sympathetic)") and fold under the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from gpufleet.diagnose.events import event_kind_for
from gpufleet.diagnose.finding import Finding, FindingKind
from gpufleet.domain.catalog import Action, Escalation
from gpufleet.domain.durations import format_duration
from gpufleet.domain.escalation import matches, triggers
from gpufleet.domain.events import Severity, worst

WINDOW = timedelta(seconds=60)
WINDOW_LINES = 300


@dataclass(frozen=True, slots=True)
class GpuRef:
    """Where a PCI address sits in the fleet (from an inventory file)."""

    node: str
    index: int | None = None
    slot: str = ""
    serial: str = ""


@dataclass(frozen=True, slots=True)
class Group:
    """The findings of one device (``key`` = normalised PCI address, or ``host``), roots first, each
    followed by its collateral findings."""

    key: str
    gpu: GpuRef | None
    findings: tuple[Finding, ...]
    severity: Severity
    action: Action
    host: str = ""  # the syslog host the lines came from ("" when the log does not say)

    @property
    def roots(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.root_line is None)


def _close(a: Finding, b: Finding) -> bool:
    if a.time is not None and b.time is not None:
        return abs((b.time - a.time).total_seconds()) <= WINDOW.total_seconds()
    if a.uptime is not None and b.uptime is not None:
        return abs(b.uptime - a.uptime) <= WINDOW.total_seconds()
    return 0 <= b.line - a.line <= WINDOW_LINES


def _xid(f: Finding, *codes: int) -> bool:
    return f.kind is FindingKind.XID and (not codes or f.code in codes)


def _root_for(f: Finding, earlier: Sequence[Finding]) -> Finding | None:
    host = f.get("host")  # a log gathered from many hosts (syslog server): causes stay on their host
    near = [e for e in reversed(earlier) if e.root_line is None and _close(e, f) and e.get("host") == host]
    same = [e for e in near if e.pci is not None and e.pci == f.pci]
    if _xid(f, 45):
        named = f.get("caused_by_xid")
        if named:
            code = int(named)
            return next((e for e in same if _xid(e, code)), None) or next(
                (e for e in near if _xid(e, code)), None
            )
        return next((e for e in same if not e.collateral), None)
    if _xid(f, 154):
        return next((e for e in same if _xid(e) and not e.collateral), None)
    if f.kind is FindingKind.GPU_LOST:
        pool = same if f.pci else near
        return next((e for e in pool if _xid(e, 79) or e.kind is FindingKind.GPU_LOST), None)
    if _xid(f, 79):
        return next((e for e in same if e.kind is FindingKind.GPU_LOST), None)
    if f.kind is FindingKind.CRASH_DUMP:
        kinds = (FindingKind.XID, FindingKind.SXID, FindingKind.GPU_LOST)
        return next((e for e in near if e.kind in kinds and not e.collateral), None)
    if _xid(f, 94, 95) and f.pci is not None:
        return next((e for e in near if _xid(e, 48, 94, 95) and e.pci not in (None, f.pci)), None)
    return None


def fold(findings: Iterable[Finding]) -> list[Finding]:
    """Mark collateral findings (``root_line`` = the line of their root cause). Order by line."""
    out: list[Finding] = []
    for f in sorted(findings, key=lambda x: x.line):
        root = _root_for(f, out)
        out.append(replace(f, root_line=root.line, collateral=True) if root else f)
    return out


def escalate(findings: Sequence[Finding], escalations: Iterable[Escalation]) -> list[Finding]:
    """Apply "N occurrences within T" escalations to the findings of one node.

    Occurrences are ordered by wall-clock time when every matching finding has one, else by seconds
    since boot; findings with neither do not count. The occurrence that completes the count (and
    every later one still inside a window) gets the escalation's severity (if worse) and action.
    """
    out = list(findings)
    for esc in escalations:
        idx = [i for i, f in enumerate(out) if matches(esc, _kinds(f), f.code)]
        timed = [(t, i) for i in idx if (t := out[i].time) is not None]
        if timed and len(timed) == len(idx):
            timed.sort()
            order = [i for _, i in timed]
            hits = triggers([t for t, _ in timed], esc.count, esc.window)
        else:
            up = sorted((u, i) for i in idx if (u := out[i].uptime) is not None)
            order = [i for _, i in up]
            hits = triggers([u for u, _ in up], esc.count, esc.window)
        for h in hits:
            f = out[order[h]]
            sev = worst([f.severity, esc.severity])
            out[order[h]] = replace(
                f,
                severity=sev,
                action=esc.action or f.action,
                escalated=f"{esc.count} x {esc.kind}" + (f" {esc.code}" if esc.code is not None else "")
                + f" within {format_duration(esc.window)}",
            )
    return out


def _kinds(f: Finding) -> tuple[str, ...]:
    ek = event_kind_for(f)
    return (f.kind.value, f.catalog_kind) + ((ek.value,) if ek else ())


def group(findings: Iterable[Finding], inventory: Mapping[str, GpuRef] | None = None) -> list[Group]:
    """Group folded findings by device, worst group first (then by first line)."""
    by_line = {f.line: f for f in findings}
    members: dict[int, list[Finding]] = {}
    roots: list[Finding] = []
    for f in sorted(by_line.values(), key=lambda x: x.line):
        if f.root_line is not None and f.root_line in by_line:
            root = by_line[f.root_line]
            while root.root_line is not None and root.root_line in by_line:
                root = by_line[root.root_line]
            members.setdefault(root.line, []).append(f)
        else:
            roots.append(f)
    per_key: dict[tuple[str, str], list[Finding]] = {}
    for r in roots:
        per_key.setdefault((r.get("host"), r.pci or "host"), []).extend([r, *members.get(r.line, [])])
    groups = []
    for (host, key), fs in per_key.items():
        top = max(fs, key=lambda f: (f.severity.rank, f.root_line is None))
        groups.append(Group(key=key, gpu=(inventory or {}).get(key), findings=tuple(fs),
                            severity=top.severity, action=top.action, host=host))
    groups.sort(key=lambda g: (-g.severity.rank, g.findings[0].line))
    return groups
