"""The ticket executor: hands a node to people with a webhook (JSON ``POST``).

The body (format ``gpufleet.ticket/v1``, documented in docs/lifecycle.md) names the node, the kind of
ticket (``hardware``: the repairs did not hold or software cannot fix it; ``retire``: a lemon node),
the fault, why, the node's repair history and the diagnostic bundle (``bundle``: id and download
URL). ``id`` (also sent as the ``Idempotency-Key`` header) is
the step's key: a controller that crashed between the POST and recording it sends the same ticket
again with the same id, for the receiver to deduplicate. 2xx = filed; 408/429/5xx or no answer =
retried; any other status is a refusal (Conflict: the action fails, visible and retryable by hand).
``httpx`` is imported when a ticket is sent, not at every controller start (most file none).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from gpufleet.domain.errors import Conflict, ExternalError

from .port import StepOutcome, StepRequest

FORMAT = "gpufleet.ticket/v1"
_RETRYABLE = {408, 425, 429}


def ticket_body(req: StepRequest, public_url: str = "") -> dict[str, Any]:
    """The webhook's body; ``bundle`` (when one was captured) links the diagnostic bundle: its id and
    the URL that downloads it (``public_url`` + ``/v1/bundles/{id}``; a path without ``public_url``)."""
    body = {
        "format": FORMAT,
        "id": req.key,
        "node": req.node,
        "kind": "retire" if req.lemon else "hardware",
        "time": req.time.isoformat().replace("+00:00", "Z"),
        "fault": {"key": req.fault.key, "action": req.fault.action.value, "text": req.fault.text},
        "reason": req.reason,
        "history": [{"time": a.time.isoformat().replace("+00:00", "Z"), "fault": a.fault, "step": a.step.value,
                     "ok": a.ok} for a in req.history],
    }
    if req.bundle:
        body["bundle"] = {"id": req.bundle, "url": f"{public_url.rstrip('/')}/v1/bundles/{quote(req.bundle, safe=':')}"}
    return body


class TicketExecutor:
    name = "ticket"

    def __init__(self, url: str, *, timeout: float = 10.0, token: str = "", public_url: str = "") -> None:
        self.url, self.timeout, self.public_url = url, timeout, public_url
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def start(self, req: StepRequest) -> None:
        import httpx

        headers = {**self._headers, "Idempotency-Key": req.key}
        try:
            r = httpx.post(self.url, json=ticket_body(req, self.public_url), headers=headers, timeout=self.timeout)
        except httpx.HTTPError as err:
            raise ExternalError("ticket webhook", f"{self.url}: {err}") from err
        if r.status_code >= 500 or r.status_code in _RETRYABLE:
            raise ExternalError("ticket webhook", f"{self.url} answered {r.status_code}: {r.text[:200]}")
        if not 200 <= r.status_code < 300:
            raise Conflict(f"ticket webhook {self.url} refused ticket {req.key}: {r.status_code} {r.text[:200]}")

    def outcome(self, req: StepRequest) -> StepOutcome | None:
        return StepOutcome(True, f"ticket {req.key} filed at {self.url}")

    def abandon(self, req: StepRequest) -> StepOutcome | None:
        return self.outcome(req)
