"""The one judgement: how bad one observation is, from the site's catalog.

Every consumer takes its severity from here — the controller's policy, the correlation engine, the
simulator, the controller's metrics and ``gpufleet diagnose`` — so one observation cannot be judged
two ways. Producers (the agent, kernel-log decoding, checks) report *observations*: what they saw
(kind, code, component, link, the agent rule that fired, the raw line), never a catalog judgement.

The rules, in order (docs/policy.md, "How an event is judged"):

1. A site override for the event (``[[override]]`` in the policy file, by code or by agent rule)
   is authoritative: its severity and action, whatever the source stated.
2. Otherwise the shipped catalog's entry for the decoded subcode row of (kind, code) when the source
   names one (``attrs.nvl5_row``: NVIDIA's "Xid 144-150 Decode" row, decision 0031), else for
   (kind, code), else for the agent rule (kind, rule), else for the kind. When the source itself
   *stated* a severity (a kernel line's ``Fatal`` / ``Non-fatal`` word, an uncorrectable-error line,
   a failed check that found wrong answers), the worse of the two counts — except for a code the
   catalog does not know, where the source's word is the best information there is (an unknown SXID
   the switch calls non-fatal stays informational).
3. Collateral entries (XID 45 and the like: a consequence of another error) are marked, so the
   policy ignores them and the correlation engine folds them under the root cause.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.domain.catalog import Action, Catalog
from gpufleet.domain.events import HealthEvent, Severity


@dataclass(frozen=True, slots=True)
class Judgement:
    severity: Severity
    action: Action
    name: str  # the catalog's name for the event (e.g. "XID 79 GPU_HAS_FALLEN_OFF_THE_BUS")
    collateral: bool = False
    basis: str = "catalog"  # catalog | site override | stated by the source | default for the kind

    @property
    def why(self) -> str:
        """How the severity was reached, for decision reasons and ``diagnose`` output."""
        return f"{self.severity} ({self.basis})"


# A process-wide count of judgements (cheap; read by the test that walks one event's path).
calls = 0


def judge(catalog: Catalog, kind: str, code: int | None, *, stated: Severity | None = None,
          rule: str = "", subcode: str = "") -> Judgement:
    """Judge one observation of ``kind``/``code`` (raised by agent ``rule``, if any; decoded to the
    ``subcode`` row, if any) with ``catalog``."""
    global calls
    calls += 1
    entry = catalog.lookup(kind, code, rule, subcode)
    name = entry.name
    if entry.site:
        return Judgement(entry.severity, entry.action, name, entry.collateral, "site override")
    if not catalog.known(kind, code, rule, subcode):
        if stated is not None:
            return Judgement(stated, entry.action, name, entry.collateral, "stated by the source")
        return Judgement(entry.severity, entry.action, name, entry.collateral, "default for the kind")
    if stated is not None and stated.rank > entry.severity.rank:
        return Judgement(stated, entry.action, name, entry.collateral, "stated by the source")
    return Judgement(entry.severity, entry.action, name, entry.collateral, "catalog")


def judge_event(catalog: Catalog, e: HealthEvent) -> Judgement:
    """Judge one :class:`HealthEvent` (its stated severity, ``attrs.rule`` and ``attrs.nvl5_row``
    count; see :func:`judge`)."""
    return judge(catalog, e.kind.value, e.code, stated=e.severity, rule=e.attr("rule"), subcode=e.attr("nvl5_row"))


def judgement_of(catalog: Catalog, e: HealthEvent) -> Judgement:
    """The event's judgement: the one the controller attached at ingest, else judged now with
    ``catalog`` (the simulator and offline tools feed events that never went through ingest)."""
    return e.judgement if e.judgement is not None else judge_event(catalog, e)
