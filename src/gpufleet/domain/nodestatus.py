"""The agent's local node status: ``gpufleet.node-status/v1`` (docs/slurm.md, docs/agent.md).

The agent writes it (atomically, every ``status_interval_s``; agent/nodestatus.py) and Slurm's
HealthCheckProgram reads it (``gpufleet slurm healthcheck``), so a node with a fatal fault is drained
by slurmd itself even while the controller is unreachable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from gpufleet.domain.errors import InvalidInput

STATUS_FORMAT = "gpufleet.node-status/v1"
STATUS_FILE_NAME = "node-status.json"  # in the agent's state_dir unless status_file says otherwise
_WORST = ("ok", "info", "degraded", "fatal")


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """The agent's local verdict (``gpufleet.node-status/v1``, see docs/slurm.md)."""

    node: str
    time: datetime
    worst: str  # ok | info | degraded | fatal
    reasons: tuple[str, ...] = ()
    decision: str = ""

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"format": STATUS_FORMAT, "node": self.node,
                                  "time": self.time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                                  "worst": self.worst, "reasons": list(self.reasons)}
        if self.decision:
            doc["decision"] = self.decision
        return doc


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
    try:
        at = datetime.fromisoformat(str(when).replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{source}.time", when, "an ISO-8601 time with a zone, e.g. 2026-11-21T12:00:00Z") from None
    if at.tzinfo is None:
        raise InvalidInput(f"{source}.time", when, "an ISO-8601 time with a zone, e.g. 2026-11-21T12:00:00Z")
    reasons = doc.get("reasons", [])
    if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
        raise InvalidInput(f"{source}.reasons", reasons, "a list of strings")
    decision = doc.get("decision", "")
    return NodeStatus(node, at, str(worst), tuple(reasons), decision if isinstance(decision, str) else "")
