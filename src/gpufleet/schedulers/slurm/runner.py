"""How the Slurm adapter runs Slurm's client commands: one injected seam.

Production uses :class:`SubprocessRunner` (``scontrol``, ``sinfo``, ``squeue``, ``scancel`` with the
right ``SLURM_CONF``); unit tests inject a runner that replays outputs recorded on the lab cluster
(``tests/fixtures/slurm/``). Classifying a failure (unreachable controller, unknown node or job,
anything else) happens here, once, so every adapter method reports failures the same way.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufleet.domain.errors import ExternalError, NotFound

log = logging.getLogger(__name__)

SYSTEM = "slurm"

# stderr fragments that mean "the controller did not answer": retry later (Slurm 22.05 wording).
_UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Zero Bytes were transmitted or received",
    "Connection refused",
    "Communication connection failure",
    "Slurm backup controller in standby mode",
)


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs one Slurm client command and returns what it printed (never raises for a non-zero exit)."""

    def __call__(self, argv: Sequence[str], *, timeout: float) -> CommandResult: ...


class SubprocessRunner:
    """Runs the real Slurm client binaries. ``slurm_conf`` sets ``SLURM_CONF`` for them."""

    def __init__(self, slurm_conf: str | None = None, *, extra_env: Mapping[str, str] | None = None) -> None:
        env = dict(os.environ)
        if slurm_conf:
            env["SLURM_CONF"] = slurm_conf
        env.update(extra_env or {})
        self._env = env

    def __call__(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        try:
            proc = subprocess.run(  # argv is built by the adapter, never a shell string
                list(argv), env=self._env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError as err:
            raise ExternalError(SYSTEM, f"{argv[0]} not found: install the Slurm client (slurm-client)",
                                retryable=False) from err
        except subprocess.TimeoutExpired as err:
            raise ExternalError(SYSTEM, f"{' '.join(argv)} did not answer within {timeout:g} s") from err
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def unreachable(text: str) -> bool:
    return any(marker in text for marker in _UNREACHABLE)


def raise_for(result: CommandResult, *, node: str | None = None, job: str | None = None) -> None:
    """Turn a failed command into gpufleet's error hierarchy (no-op when it succeeded)."""
    if result.returncode == 0:
        return
    text = (result.stderr or result.stdout).strip()
    cmd = " ".join(result.argv)
    if unreachable(text):
        log.warning("slurm controller unreachable (%s): %s", cmd, text)
        raise ExternalError(SYSTEM, f"controller unreachable: {text}")
    if node is not None and ("Invalid node name" in text or f"Node {node} not found" in text):
        raise NotFound("node", node)
    if job is not None and "Invalid job id" in text:
        raise NotFound("job", job)
    raise ExternalError(SYSTEM, f"{cmd} failed (rc={result.returncode}): {text}", retryable=False)
