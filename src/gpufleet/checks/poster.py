"""Post check results to the controller: ``POST {controller}/v1/events`` with a bearer token.

The controller answers 202 when it stored the batch. Anything else (unreachable, timeout, 4xx/5xx)
raises :class:`ExternalError` naming the controller URL and what went wrong; the CLI maps it to exit
code 5. Events carry idempotency ids, so re-posting after a failure is safe: with ``retry_for_s``
a refused connection, a timeout, a 5xx or a 429 is retried (backoff doubling from 0.5 s to 10 s) for
that long, so a check whose controller is restarting (a validation job's verdict) is not lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
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
    retry_for_s: float = 0.0,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Send ``events`` in batches; returns how many were accepted. Retryable failures are retried
    for ``retry_for_s`` seconds (0: not at all)."""
    if retry_for_s < 0:
        raise InvalidInput("retry_for_s", retry_for_s, "seconds, 0 or more")
    if not controller.startswith(("http://", "https://")):
        raise InvalidInput("--controller", controller, "an http:// or https:// URL")
    url = controller.rstrip("/") + "/v1/events"
    headers = {"Authorization": f"Bearer {token}"}
    sent = 0
    give_up = clock() + retry_for_s
    with httpx.Client(timeout=timeout_s, transport=transport) as client:
        for start in range(0, len(events), BATCH):
            batch = events[start : start + BATCH]
            delay = 0.5
            while True:
                try:
                    _post(client, url, headers, batch, timeout_s)
                    break
                except ExternalError as err:
                    if not err.retryable or clock() + delay > give_up:
                        raise
                    log.warning("posting check events failed (%s); retrying in %.1f s", err, delay)
                    sleep(delay)
                    delay = min(delay * 2, 10.0)
            sent += len(batch)
            log.info("posted %d check events to %s", len(batch), url)
    return sent


def _post(client: httpx.Client, url: str, headers: dict[str, str], batch: Sequence[HealthEvent],
          timeout_s: float) -> None:
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
