"""The agent's local node status: ``gpufleet.node-status/v1`` (docs/slurm.md, docs/agent.md).

The agent writes it (atomically, every ``status_interval_s``; agent/nodestatus.py) with the
*observations* it made recently, and Slurm's HealthCheckProgram reads it (``gpufleet slurm
healthcheck``), judges them with the one judging function (:func:`verdict`: the shipped catalog, or the
site's policy file given to the hook) and drains the node on a fatal one — so slurmd drains it even
while the controller is unreachable. The agent itself judges nothing (docs/decisions/0001). ``worst``
and ``reasons`` are what another writer (a site script) may state directly; the agent writes "ok".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from gpufleet.domain.catalog import Catalog
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import Severity
from gpufleet.domain.judgement import judge

STATUS_FORMAT = "gpufleet.node-status/v1"
STATUS_FILE_NAME = "node-status.json"  # in the agent's state_dir unless status_file says otherwise
_WORST = ("ok", "info", "degraded", "fatal")


@dataclass(frozen=True, slots=True)
class Observation:
    """One recent observation of the agent, as it would report it to the controller."""

    kind: str
    code: int | None = None
    component: str = ""
    rule: str = ""
    stated: str = ""  # what the source itself stated (fatal | degraded | info), or ""
    subcode: str = ""  # the decoded NVLink5 row (``attrs.nvl5_row``), or ""

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"kind": self.kind, "code": self.code, "component": self.component,
                                  "rule": self.rule, "stated": self.stated}
        if self.subcode:
            doc["subcode"] = self.subcode
        return doc


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """The node's local status (``gpufleet.node-status/v1``, see docs/slurm.md)."""

    node: str
    time: datetime
    worst: str  # ok | info | degraded | fatal: what the writer states itself (the agent: "ok")
    reasons: tuple[str, ...] = ()
    decision: str = ""
    observations: tuple[Observation, ...] = ()
    # When the agent last delivered to the controller (its events or a heartbeat), None if never or not
    # stated: the health-check hook leaves a fatal verdict to a controller reached lately (docs/slurm.md).
    controller_reached: datetime | None = None

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"format": STATUS_FORMAT, "node": self.node,
                                  "time": _stamp(self.time),
                                  "worst": self.worst, "reasons": list(self.reasons)}
        if self.decision:
            doc["decision"] = self.decision
        if self.observations:
            doc["observations"] = [o.to_json() for o in self.observations]
        if self.controller_reached is not None:
            doc["controller_reached"] = _stamp(self.controller_reached)
        return doc


def _stamp(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(value: object, field: str) -> datetime:
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(field, value, "an ISO-8601 time with a zone, e.g. 2026-11-21T12:00:00Z") from None
    if at.tzinfo is None:
        raise InvalidInput(field, value, "an ISO-8601 time with a zone, e.g. 2026-11-21T12:00:00Z")
    return at


def verdict(status: NodeStatus, catalog: Catalog) -> tuple[str, tuple[str, ...]]:
    """The worst severity and its reasons: what the writer stated, and each observation judged once
    with ``catalog`` (collateral codes count as nothing)."""
    worst, reasons = status.worst, list(status.reasons)
    for o in status.observations:
        j = judge(catalog, o.kind, o.code, stated=Severity(o.stated) if o.stated else None, rule=o.rule,
                  subcode=o.subcode)
        if j.collateral or j.severity is Severity.INFO:
            continue
        code = f" {o.code}" if o.code is not None else ""
        where = f" on {o.component}" if o.component else ""
        why = f"{o.kind}{code} ({j.name}){where}: {j.severity}"
        if _WORST.index(j.severity.value) > _WORST.index(worst):
            worst, reasons = j.severity.value, [why]
        elif j.severity.value == worst:
            reasons.append(why)
    return worst, tuple(dict.fromkeys(reasons))


def parse_status(text: str, source: str = "status") -> NodeStatus:
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise InvalidInput(source, text[:80], f"a JSON object in format {STATUS_FORMAT} ({err})") from None
    if not isinstance(doc, dict):
        raise InvalidInput(source, doc, f"a JSON object in format {STATUS_FORMAT}")
    if doc.get("format") != STATUS_FORMAT:
        raise InvalidInput(f"{source}.format", doc.get("format"), STATUS_FORMAT)
    node, worst, when = doc.get("node"), doc.get("worst"), doc.get("time")
    if not isinstance(node, str) or not node:
        raise InvalidInput(f"{source}.node", node, "a node name")
    if worst not in _WORST:
        raise InvalidInput(f"{source}.worst", worst, f"one of {list(_WORST)}")
    at = _time(when, f"{source}.time")
    reached = doc.get("controller_reached")
    controller_reached = None if reached is None else _time(reached, f"{source}.controller_reached")
    reasons = doc.get("reasons", [])
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise InvalidInput(f"{source}.reasons", reasons, "a list of strings")
    decision = doc.get("decision", "")
    obs = doc.get("observations", [])
    if not isinstance(obs, list):
        raise InvalidInput(f"{source}.observations", obs, "a list of objects")
    observations = []
    for i, o in enumerate(obs):
        where = f"{source}.observations[{i}]"
        if not isinstance(o, dict) or not isinstance(o.get("kind"), str) or not o["kind"]:
            raise InvalidInput(f"{where}.kind", o.get("kind") if isinstance(o, dict) else o, "an event kind")
        code = o.get("code")
        if code is not None and (not isinstance(code, int) or isinstance(code, bool)):
            raise InvalidInput(f"{where}.code", code, "an integer or null")
        stated = o.get("stated") or ""
        if stated not in ("", "info", "degraded", "fatal"):
            raise InvalidInput(f"{where}.stated", stated, "fatal, degraded, info or empty")
        subcode = o.get("subcode") or ""
        if not isinstance(subcode, str):
            raise InvalidInput(f"{where}.subcode", subcode, "a decoded NVLink5 row name (a string) or empty")
        observations.append(Observation(o["kind"], code, str(o.get("component") or ""), str(o.get("rule") or ""),
                                        stated, subcode))
    return NodeStatus(node, at, str(worst), tuple(reasons), decision if isinstance(decision, str) else "",
                      tuple(observations), controller_reached)
