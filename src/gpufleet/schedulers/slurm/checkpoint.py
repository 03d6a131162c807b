"""How a Slurm job tells gpufleet "I just wrote a checkpoint".

Two carriers, both readable without the controller:

* **The job's Comment field.** ``gpufleet slurm checkpoint`` (run by the job, as its own user) sets
  the token ``gpufleet:checkpoint=<ISO-8601 UTC>`` in the job's comment, keeping any other text. The
  Slurm adapter reads it back from ``squeue --json`` into :attr:`Job.last_checkpoint`, so a
  "drain after checkpoint" can be decided from the scheduler alone.
* **A marker file** the training loop touches after each checkpoint; its modification time is the
  checkpoint time (:func:`marker_time`). The hook turns it into the comment token and, when given a
  controller URL, into ``POST /v1/jobs/{job_id}/checkpoint``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.domain.errors import InvalidInput, NotFound

TOKEN = "gpufleet:checkpoint="
_TOKEN_RE = re.compile(re.escape(TOKEN) + r"(\S*)")  # an empty token is replaced too


def format_time(at: datetime) -> str:
    if at.tzinfo is None:
        raise InvalidInput("checkpoint time", at.isoformat(), "a timezone-aware time")
    # Sub-second precision is kept: a checkpoint is compared with the time a drain was decided.
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_checkpoint(comment: str) -> datetime | None:
    """The checkpoint time carried in a job comment, or None (also for a garbled token)."""
    m = _TOKEN_RE.search(comment or "")
    if not m:
        return None
    try:
        at = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def with_checkpoint(comment: str, at: datetime) -> str:
    """``comment`` with its checkpoint token set to ``at`` (other text is kept)."""
    token = TOKEN + format_time(at)
    rest = _TOKEN_RE.sub("", comment or "").strip()
    return f"{rest} {token}".strip()


def marker_time(path: Path) -> datetime:
    """The checkpoint time a marker file records: its modification time (UTC)."""
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except FileNotFoundError:
        raise NotFound("checkpoint marker", str(path)) from None
