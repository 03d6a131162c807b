"""Post check results to the controller: ``POST {controller}/v1/events`` with a bearer token.

The controller answers 202 when it stored the batch. Anything else (unreachable, timeout, 4xx/5xx)
raises :class:`ExternalError` naming the controller URL and what went wrong; the CLI maps it to exit
code 5. Events carry idempotency ids, so re-posting after a failure is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import httpx

from gpufleet.checks.events import events_body
from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.domain.events import HealthEvent

log = logging.getLogger(__name__)

BATCH = 500


def read_token(path: Path) -> str:
    """The bearer token from ``path`` (surrounding whitespace stripped)."""
    try:
        token = path.read_text("utf-8").strip()
    except OSError as err:
        raise InvalidInput("--token-file", str(path), f"a readable file ({err.strerror})") from err
    if not token:
        raise InvalidInput("--token-file", str(path), "a file containing a non-empty token")
    return token


def post_events(
    controller: str,
    token: str,
    events: Sequence[HealthEvent],
    *,
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """Send ``events`` in batches; returns how many were accepted."""
    if not controller.startswith(("http://", "https://")):
        raise InvalidInput("--controller", controller, "an http:// or https:// URL")
    url = controller.rstrip("/") + "/v1/events"
    headers = {"Authorization": f"Bearer {token}"}
    sent = 0
    with httpx.Client(timeout=timeout_s, transport=transport) as client:
        for start in range(0, len(events), BATCH):
            batch = events[start : start + BATCH]
            try:
                resp = client.post(url, json=events_body(batch), headers=headers)
            except httpx.TimeoutException as err:
                raise ExternalError("controller", f"{url} did not answer within {timeout_s:g} s") from err
            except httpx.HTTPError as err:
                raise ExternalError("controller", f"cannot reach {url}: {err}") from err
            if resp.status_code != 202:
                detail = resp.text[:300].strip()
                raise ExternalError(
                    "controller",
                    f"{url} answered {resp.status_code} (expected 202): {detail}",
                    retryable=resp.status_code >= 500 or resp.status_code == 429,
                )
            sent += len(batch)
            log.info("posted %d check events to %s", len(batch), url)
    return sent
