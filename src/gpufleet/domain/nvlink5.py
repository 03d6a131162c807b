"""NVLink5 Xids 144-150 decoded by subcode: what the line says, from NVIDIA's "Xid 144-150 Decode".

The register form of the line (``NETIR_LINK_EVT Fatal XC0 i0 Link 01 (0x021425c6 0x00000000 ...)``,
six registers from R570 drivers on, four in some builds) carries *intrinfo* in its first register and
the *error status* word in its second. NVIDIA's sheet (``domain/data/nvlink5_decode.csv``, built by
``scripts/build_xid_catalog.py`` from ``scripts/nvlink5_table.py``) matches a row by unit, intrinfo
bit pattern (two layouts: drivers before R575, and R575 on; bits 20-25 are the subcode) and error status,
and gives the severity, hardware vs software, the local/remote effect and what to investigate.

:func:`decode` returns the matching :class:`Rule`, or None. The kernel-log decoder names the row
(:attr:`Rule.key`, ``nvl5_row`` in the finding and the event's ``attrs``) and turns its investigatory
hint into ``suspect=peer``, ``suspect=cable``, ... for the correlator. Each row is also a catalog
entry more specific than its Xid's (``Catalog.subcodes``, built by ``domain.catalog``), so the one
judging function (``domain.judgement.judge``) judges a decoded line by its row: a non-fatal row is
info even though the code's own entry (the floor for an undecoded Xid 144-150) is degraded. Where
NVIDIA's table and the line's ``Fatal``/``Nonfatal`` word disagree, the table wins (docs/diagnose.md,
"NVLink5"; decisions 0030 and 0031). Pure: reads the shipped CSV only.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

from gpufleet.domain.events import Severity


@dataclass(frozen=True, slots=True)
class Rule:
    xid: int
    unit: str  # as NVIDIA names it, aliases separated by "/" (NETIR_LINK_EVT/NETIR_LINK_DOWN)
    v1: str  # intrinfo pattern, drivers before R575 (32 chars, bit 31 first, "-" = any)
    v2: str  # intrinfo pattern, R575 and later
    error_status: int
    severity: str  # NVIDIA's word: Fatal, Link Fatal, Non-fatal, Fatal**, ...
    resolution: str  # NVIDIA's immediate bucket: RESET_GPU, IGNORE, XID_154_EVAL
    investigatory: str
    hw_sw: str
    effect: str
    suspect: str  # our reading of ``investigatory``: peer, cable, software, host, local, ...

    @property
    def key(self) -> str:
        """The row's name within its Xid: ``unit:error status:intrinfo bits 25-20`` (R575 layout, ``-``
        for any), e.g. ``NETIR_LINK_EVT/NETIR_LINK_DOWN:0x00000000:010101``. Unique per Xid."""
        return f"{self.unit}:0x{self.error_status:08x}:{self.v2[6:12]}"

    @property
    def stated(self) -> Severity:
        """The severity this row gives the line: any fatal word -> fatal, else info (NVIDIA's immediate
        resolution for every non-fatal row is IGNORE or "evaluate the Xid 154 that follows")."""
        return Severity.FATAL if "fatal" in self.severity.lower() and "non" not in self.severity.lower() \
            else Severity.INFO


def _matches(pattern: str, value: int) -> bool:
    for i, ch in enumerate(pattern):
        bit = (value >> (31 - i)) & 1
        if (ch == "1" and not bit) or (ch == "0" and bit):
            return False
    return True


def _norm(unit: str) -> str:
    return "".join(c for c in unit.upper() if c.isalnum() or c == "_")


@cache
def rules() -> dict[int, tuple[Rule, ...]]:
    """The shipped table, by Xid."""
    text = (resources.files("gpufleet.domain") / "data" / "nvlink5_decode.csv").read_text(encoding="utf-8")
    out: dict[int, list[Rule]] = {}
    for r in csv.DictReader(io.StringIO(text)):
        rule = Rule(int(r["xid"]), r["unit"], r["intrinfo_v1"], r["intrinfo_v2"], int(r["error_status"], 16),
                    r["severity"], r["resolution"], r["investigatory"], r["hw_sw"], r["effect"], r["suspect"])
        out.setdefault(rule.xid, []).append(rule)
    return {k: tuple(v) for k, v in out.items()}


def _unit_ok(rule: Rule, unit: str) -> bool:
    if not unit:
        return True
    want = _norm(unit)
    names = [rule.unit, *rule.unit.split("/")]
    return any(_norm(n) == want for n in names) or _norm(unit.replace("/", "")) == _norm(rule.unit.replace("/", ""))


def decode(xid: int, unit: str, registers: list[int]) -> Rule | None:
    """The row of NVIDIA's table for this line, or None (unknown unit/subcode/status, too few registers).

    ``registers`` are the hex words in the parentheses: intrinfo first, error status second. A row
    matches when its unit is the line's (or one of its ``/`` aliases), its error status equals the
    second register and either intrinfo layout matches the first.
    """
    if len(registers) < 2:
        return None
    intrinfo, status = registers[0], registers[1]
    for rule in rules().get(xid, ()):
        if rule.error_status == status and _unit_ok(rule, unit) and (
            _matches(rule.v2, intrinfo) or _matches(rule.v1, intrinfo)
        ):
            return rule
    return None


def subcode(intrinfo: int) -> int:
    """Bits 20-25 of intrinfo: the link-down reason of Xid 149 NETIR_LINK_EVT (0 for most units)."""
    return (intrinfo >> 20) & 0x3F
