"""Check results as health events for the controller (``POST /v1/events``). Pure: no I/O.

Mapping (docs/checks.md):

* pass -> ``check_passed``;
* warn -> ``check_passed`` (above the fail bar; ``attrs.status`` says ``warn`` so the fleet view still
  shows it, but it must not hold a node out of service);
* fail -> ``check_failed`` with ``attrs.rule`` = the check's name, so the controller judges it with the
  site's catalog (``check_failed`` is degraded by default; a site overrides one check with
  ``[[override]] kind = "check_failed" rule = "<check>"``). A result that means wrong answers or a
  dying GPU (silent data corruption, an XID during soak) *states* ``fatal`` (severity), which the
  judgement takes as a floor;
* a failed result about a whole allocation (``attrs.scope == "allocation"``: the multi-node all-reduce)
  is ``check_failed`` with ``attrs.rule = "allocation"``, judged informational: it is filed against the
  reporting node but blames no node by itself; the pairwise results that follow it name the slow node.

The event ``id`` is the idempotency key: ``check:<node>:<run>:<check>:<gpu|node>``, so a re-post of
the same run is deduplicated by the controller.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from gpufleet.checks.model import CheckResult, Status
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.fleet import gpu_slot
from gpufleet.domain.wire import to_wire

ALLOCATION = "allocation"


def result_slot(node: str, gpu: int | None) -> str | None:
    """The fleet's slot id for GPU ``gpu`` of ``node`` (``r01-n03-gpu5``); None for node-wide results."""
    return None if gpu is None else gpu_slot(node, gpu)


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def result_to_event(
    result: CheckResult, *, node: str, run_id: str, time: datetime, sku: str = ""
) -> HealthEvent:
    """One judged result as a :class:`HealthEvent` (pure). ``node`` is the reporter; a result that
    names its own node (multinode blame) is filed against that node. ``sku`` (the report's SKU) goes
    into ``attrs.sku`` so the controller can judge the result against its SKU's fleet."""
    if not node:
        raise InvalidInput("node", node, "a non-empty node name")
    if not run_id:
        raise InvalidInput("run_id", run_id, "a non-empty run id")
    if time.tzinfo is None:
        raise InvalidInput("time", time.isoformat(), "a timezone-aware time")
    node = result.node or node
    failed = result.status is Status.FAIL
    allocation = dict(result.attrs).get("scope") == ALLOCATION
    stated = Severity.FATAL if failed and result.fatal and not allocation else None
    where = "node" if result.gpu is None else f"gpu{result.gpu}"
    summary = (
        f"{result.check} {where}: {result.value:.4g} {result.unit}"
        + ("" if result.expected is None else f" (expected {result.expected:.4g})")
        + f" -> {result.status}"
        + (f": {result.message}" if result.message else "")
    )
    attrs = {
        "check": result.check,
        "gpu": "" if result.gpu is None else str(result.gpu),
        "value": _num(result.value),
        "unit": result.unit,
        "expected": _num(result.expected),
        "status": str(result.status),
        "margin": _num(result.margin),
        "run": run_id,
    }
    if sku:
        attrs["sku"] = sku
    if failed:
        attrs["rule"] = ALLOCATION if allocation else result.check
    attrs.update(dict(result.attrs))
    return HealthEvent(
        id=f"check:{node}:{run_id}:{result.check}:{where}",
        node=node,
        kind=EventKind.CHECK_FAILED if failed else EventKind.CHECK_PASSED,
        time=time,
        component=result_slot(node, result.gpu),
        severity=stated,
        message=summary,
        source="check",
        attrs=tuple(sorted(attrs.items())),
    )


def events_body(events: Iterable[HealthEvent]) -> dict[str, object]:
    """``{"events": [...]}`` for one POST."""
    return {"events": [to_wire(e) for e in events]}
