"""The fault catalog: what each XID / SXID / event kind means, how bad it is, and what to do.

The shipped table (``data/xid_catalog.csv``, built by ``scripts/build_xid_catalog.py`` from NVIDIA's
XID catalog, source named per row) is the default. Operators override per code and add "N
occurrences within T" escalations in TOML (``docs/policy.md``)::

    [[override]]
    kind = "xid"
    code = 94
    severity = "fatal"
    action = "reset_gpu"

    [[escalation]]
    kind = "xid"
    code = 94
    count = 2
    window = "24h"
    severity = "fatal"
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from importlib import resources
from typing import Any, TypeVar

from gpufleet.domain import nvlink5
from gpufleet.domain.durations import parse_duration
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, Severity

_E = TypeVar("_E", bound=StrEnum)


class Action(StrEnum):
    """What an operator (or automation) should do about a finding."""

    NONE = "none"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    DRAIN_AND_INSPECT = "drain_and_inspect"
    CHECK_CABLING = "check_cabling"
    UPDATE_SOFTWARE = "update_software"
    CONTACT_SUPPORT = "contact_support"
    REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    kind: str  # an EventKind value, or a decoder-specific kind such as "aer"
    code: int | None
    name: str
    severity: Severity
    action: Action
    meaning: str = ""
    nvidia_resolution: str = ""
    component: str = ""
    collateral: bool = False  # a consequence of another error (e.g. XID 45): fold under the root
    source: str = ""
    rule: str = ""  # the agent rule this entry judges (rule entries only; see Catalog.rules)
    site: bool = False  # set by the site's policy file: authoritative over what a source states


@dataclass(frozen=True, slots=True)
class Escalation:
    """``count`` events of (kind, code) on one node within ``window`` raise severity to ``severity``."""

    kind: str
    code: int | None
    count: int
    window: timedelta
    severity: Severity
    action: Action | None = None


# Judgement for event kinds that carry no code (or whose code is not in the table).
_KIND_DEFAULTS: dict[str, tuple[Severity, Action]] = {
    EventKind.XID: (Severity.DEGRADED, Action.CONTACT_SUPPORT),  # unknown XID code: look at it
    EventKind.SXID: (Severity.DEGRADED, Action.CONTACT_SUPPORT),
    EventKind.LINK_ERROR: (Severity.INFO, Action.NONE),
    EventKind.LINK_DOWN: (Severity.DEGRADED, Action.CHECK_CABLING),
    EventKind.LINK_FLAP: (Severity.DEGRADED, Action.CHECK_CABLING),
    EventKind.ECC_SBE: (Severity.INFO, Action.NONE),
    EventKind.ECC_DBE: (Severity.FATAL, Action.RESET_GPU),
    EventKind.ROW_REMAP_PENDING: (Severity.DEGRADED, Action.RESET_GPU),
    EventKind.ROW_REMAP_FAILURE: (Severity.FATAL, Action.REPLACE),
    EventKind.THERMAL: (Severity.DEGRADED, Action.DRAIN_AND_INSPECT),
    EventKind.AER_CORRECTED: (Severity.INFO, Action.NONE),
    EventKind.AER_UNCORRECTED: (Severity.FATAL, Action.DRAIN_AND_INSPECT),
    EventKind.CHECK_FAILED: (Severity.DEGRADED, Action.DRAIN_AND_INSPECT),
    EventKind.CHECK_PASSED: (Severity.INFO, Action.NONE),
    EventKind.MOVED: (Severity.INFO, Action.NONE),
    EventKind.GPU_LOST: (Severity.FATAL, Action.REBOOT),
    EventKind.HEARTBEAT_LOST: (Severity.DEGRADED, Action.DRAIN_AND_INSPECT),
    EventKind.GPU_IDLE: (Severity.INFO, Action.NONE),  # usage: for the job's owner, never a drain
}

DEFAULT_ESCALATIONS: tuple[Escalation, ...] = (
    # XID 94 (contained ECC) twice within a day means the HBM is going: drain now.
    Escalation("xid", 94, 2, timedelta(hours=24), Severity.FATAL, Action.RESET_GPU),
    # Corrected-error storms: 100 SBE events in an hour announce a failing HBM stack.
    Escalation("ecc_sbe", None, 100, timedelta(hours=1), Severity.DEGRADED, Action.DRAIN_AND_INSPECT),
    # A link that errors 50 times in 10 minutes is degrading the job's collectives.
    Escalation("link_error", None, 50, timedelta(minutes=10), Severity.DEGRADED, Action.CHECK_CABLING),
    # Five flaps in an hour: take the node out and reseat/replace the cable.
    Escalation("link_flap", None, 5, timedelta(hours=1), Severity.FATAL, Action.CHECK_CABLING),
)


@dataclass(frozen=True, slots=True)
class Catalog:
    """The site's fault catalog: shipped entries per (kind, code), entries per agent rule (kind, rule),
    entries per decoded subcode (kind, code, row: NVIDIA's "Xid 144-150 Decode" rows, see
    :mod:`gpufleet.domain.nvlink5`), escalations. Judging with it is
    :func:`gpufleet.domain.judgement.judge` (the one place)."""

    entries: Mapping[tuple[str, int | None], CatalogEntry]
    escalations: tuple[Escalation, ...] = DEFAULT_ESCALATIONS
    rules: Mapping[tuple[str, str], CatalogEntry] = field(default_factory=dict)
    subcodes: Mapping[tuple[str, int, str], CatalogEntry] = field(default_factory=dict)

    def lookup(self, kind: str, code: int | None, rule: str = "", subcode: str = "") -> CatalogEntry:
        """The entry that judges an event of ``kind``/``code`` raised by ``rule``, most specific first:
        a site entry for (kind, code); the decoded ``subcode`` row of (kind, code); (kind, code); the
        agent rule (kind, rule); a decoder catalog kind named by ``rule`` (a kernel-log ``nvlink`` /
        ``ib_link`` / ``mce_edac`` finding reported as a link or check event) with the code, then
        without; the kind's own entry; else the kind's default judgement (:meth:`known` tells the
        default apart)."""
        hit = self._find(kind, code, rule, subcode)
        if hit is not None:
            return hit
        sev, action = _KIND_DEFAULTS.get(kind, (Severity.DEGRADED, Action.CONTACT_SUPPORT))
        name = f"{kind.upper()} {code}" if code is not None else kind
        return CatalogEntry(kind=kind, code=code, name=name, severity=sev, action=action)

    def known(self, kind: str, code: int | None, rule: str = "", subcode: str = "") -> bool:
        """Whether the catalog has an entry of its own for this event (not just the kind's default)."""
        return self._find(kind, code, rule, subcode) is not None

    def _find(self, kind: str, code: int | None, rule: str, subcode: str = "") -> CatalogEntry | None:
        get = self.entries.get
        hit = get((kind, code)) if code is not None else None
        if subcode and code is not None:
            # a site entry for the row beats one for the code, which beats the shipped row
            sub = self.subcodes.get((kind, code, subcode))
            if sub is not None and (hit is None or not hit.site or sub.site):
                hit = sub
        if hit is None and rule:
            hit = self.rules.get((kind, rule)) or (get((rule, code)) if code is not None else None) or get((rule, None))
        return hit if hit is not None else get((kind, None))

    def with_entries(self, entries: Iterable[CatalogEntry]) -> Catalog:
        merged = dict(self.entries)
        for e in entries:
            merged[(e.kind, e.code)] = e
        return Catalog(entries=merged, escalations=self.escalations, rules=self.rules, subcodes=self.subcodes)

    def with_overrides(self, doc: Mapping[str, Any], source: str = "override") -> Catalog:
        """Apply a parsed TOML document with ``[[override]]`` and ``[[escalation]]`` tables.

        Every problem raises InvalidInput naming the table, index and field; nothing is applied
        unless the whole document is valid.
        """
        unknown = set(doc) - {"override", "escalation"}
        if unknown:
            key = sorted(unknown)[0]
            raise InvalidInput(key, doc[key], "only [[override]] and [[escalation]] tables")
        merged = dict(self.entries)
        rules = dict(self.rules)
        subcodes = dict(self.subcodes)
        # Event kinds, and every catalog kind the data knows (the decoder's aer, nvlink, kernel_panic, ...).
        known = {k.value for k in EventKind} | {k for k, _ in self.entries} | {k for k, _ in self.rules}
        for i, item in enumerate(_tables(doc, "override")):
            path = f"override[{i}]"
            _only(item, path, {"kind", "code", "rule", "subcode", "severity", "action", "name", "meaning"})
            kind = _kind(item, path, known)
            code = _code(item, path)
            rule = item.get("rule", "")
            if not isinstance(rule, str):
                raise InvalidInput(f"{path}.rule", rule, "the name of an agent rule, e.g. hbm_thermal")
            if rule and code is not None:
                raise InvalidInput(f"{path}.rule", rule, "either code or rule, not both")
            subcode = _subcode(item, path, kind, code, self.subcodes)
            base = self.lookup(kind, code, rule, subcode)
            entry = replace(
                base,
                code=code,
                severity=_enum(Severity, item.get("severity", base.severity), f"{path}.severity"),
                action=_enum(Action, item.get("action", base.action), f"{path}.action"),
                name=str(item.get("name", base.name)),
                meaning=str(item.get("meaning", base.meaning)),
                source=source,
                rule=subcode or rule,
                site=True,
            )
            if subcode and code is not None:
                subcodes[(kind, code, subcode)] = entry
            elif rule:
                rules[(kind, rule)] = entry
            else:
                merged[(kind, code)] = entry
        escalations = list(self.escalations)
        for i, item in enumerate(_tables(doc, "escalation")):
            path = f"escalation[{i}]"
            _only(item, path, {"kind", "code", "count", "window", "severity", "action"})
            count = item.get("count")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise InvalidInput(f"{path}.count", count, "an integer >= 1")
            if "window" not in item:
                raise InvalidInput(f"{path}.window", None, "a duration such as 24h")
            esc = Escalation(
                kind=_kind(item, path, known),
                code=_code(item, path),
                count=count,
                window=parse_duration(item["window"], f"{path}.window"),
                severity=_enum(Severity, item.get("severity", "fatal"), f"{path}.severity"),
                action=_enum(Action, item["action"], f"{path}.action") if "action" in item else None,
            )
            escalations = [e for e in escalations if (e.kind, e.code) != (esc.kind, esc.code)] + [esc]
        return Catalog(entries=merged, escalations=tuple(escalations), rules=rules, subcodes=subcodes)


def _tables(doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    raw = doc.get(key, [])
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise InvalidInput(key, raw, f"an array of tables ([[{key}]])")
    return raw


def _only(item: Mapping[str, Any], path: str, allowed: set[str]) -> None:
    for k in item:
        if k not in allowed:
            raise InvalidInput(f"{path}.{k}", item[k], f"one of the fields {sorted(allowed)}")


def _kind(item: Mapping[str, Any], path: str, known: set[str]) -> str:
    kind = item.get("kind")
    if not isinstance(kind, str) or not kind:
        raise InvalidInput(f"{path}.kind", kind, "an event kind such as xid, sxid, ecc_dbe")
    if kind not in known:
        raise InvalidInput(f"{path}.kind", kind, f"one of {sorted(known)}")
    return kind


def _subcode(item: Mapping[str, Any], path: str, kind: str, code: int | None,
             rows: Mapping[tuple[str, int, str], CatalogEntry]) -> str:
    """A decoded subcode row of (kind, code) the catalog knows (``SAW_MVB:0x00000001:000000``), or ""."""
    row = item.get("subcode", "")
    if row == "":
        return ""
    known = sorted(r for k, c, r in rows if k == kind and c == code)
    if not isinstance(row, str) or code is None or row not in known:
        want = (f"one of the {len(known)} decoded rows of {kind} {code}, e.g. {known[0]}" if known
                else f"absent: {kind} {code} has no decoded subcode rows (XIDs 144-150 do)")
        raise InvalidInput(f"{path}.subcode", row, want)
    return row


def _code(item: Mapping[str, Any], path: str) -> int | None:
    code = item.get("code")
    if code is not None and (not isinstance(code, int) or isinstance(code, bool) or code < 0):
        raise InvalidInput(f"{path}.code", code, "a non-negative integer, or absent")
    return code


def _enum(cls: type[_E], value: Any, field: str) -> _E:
    try:
        return cls(value)
    except ValueError:
        raise InvalidInput(field, value, f"one of {[m.value for m in cls]}") from None


def load_default_catalog() -> Catalog:
    """The catalog shipped in the package (every ``data/*_catalog.csv`` file)."""
    entries: dict[tuple[str, int | None], CatalogEntry] = {}
    rules: dict[tuple[str, str], CatalogEntry] = {}
    data = resources.files("gpufleet.domain") / "data"
    for res in sorted(data.iterdir(), key=lambda r: r.name):
        if res.name.endswith("_catalog.csv"):
            for e in _read_csv(res.read_text(encoding="utf-8")):
                if e.rule:
                    rules[(e.kind, e.rule)] = e
                else:
                    entries[(e.kind, e.code)] = e
    return Catalog(entries=entries, rules=rules, subcodes=_subcode_entries(entries))


def _subcode_entries(
    entries: Mapping[tuple[str, int | None], CatalogEntry],
) -> dict[tuple[str, int, str], CatalogEntry]:
    """NVIDIA's "Xid 144-150 Decode" rows as entries under their Xid: a fatal row (any fatal word) is
    fatal, reset_gpu (NVIDIA's resolution of every fatal row); a non-fatal row is info, none (NVIDIA's
    immediate resolution for each is IGNORE, or "evaluate the Xid 154 that follows", which carries its
    own recovery action). Decision 0031."""
    out: dict[tuple[str, int, str], CatalogEntry] = {}
    for xid, rows in nvlink5.rules().items():
        base = entries.get(("xid", xid))
        for r in rows:
            fatal = r.stated is Severity.FATAL
            out[("xid", xid, r.key)] = CatalogEntry(
                kind="xid", code=xid, name=base.name if base else f"XID {xid}",
                severity=r.stated, action=Action.RESET_GPU if fatal else Action.NONE,
                meaning=f"{r.unit}: {r.severity}, {r.hw_sw}; {r.effect}",
                nvidia_resolution=f"immediate={r.resolution}; investigatory={r.investigatory}",
                component="NVLink5 link" if r.suspect in ("cable", "peer", "link", "sympathetic") else "GPU",
                source="NVIDIA Xid catalog, sheet 'XID 144-150 Decode' (domain/data/nvlink5_decode.csv)",
                rule=r.key,
            )
    return out


def _read_csv(text: str) -> Iterable[CatalogEntry]:
    for row in csv.DictReader(io.StringIO(text)):
        yield CatalogEntry(
            kind=row["kind"],
            code=int(row["code"]) if row.get("code") else None,
            name=row["name"],
            severity=Severity(row["severity"]),
            action=Action(row["action"]),
            meaning=row.get("meaning", ""),
            nvidia_resolution=row.get("nvidia_resolution", ""),
            component=row.get("component", ""),
            collateral=row.get("collateral", "") == "yes",
            source=row.get("source", ""),
            rule=row.get("rule") or "",
        )
