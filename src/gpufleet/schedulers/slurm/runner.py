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
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class StreamingRunner(Protocol):
    """A runner that can also hand over a command's output as it comes (a whole queue's ``squeue --json``
    is hundreds of MB: the reader parses it record by record instead of holding it)."""

    def stream(self, argv: Sequence[str], *, timeout: float) -> Iterator[str]: ...


def stream_output(runner: CommandRunner, argv: Sequence[str], *, timeout: float) -> Iterator[str]:
    """``argv``'s standard output in chunks: streamed when the runner can, else all of it at once
    (recorded replays in tests). A failed command raises (:func:`raise_for`) after its last chunk."""
    if isinstance(runner, StreamingRunner):
        yield from runner.stream(argv, timeout=timeout)
        return
    res = runner(argv, timeout=timeout)
    raise_for(res)
    yield res.stdout


CHUNK = 1 << 20  # characters read at a time from a streamed command


class SubprocessRunner:
    """Runs the real Slurm client binaries. ``slurm_conf`` sets ``SLURM_CONF`` for them."""

    def __init__(self, slurm_conf: str | None = None, *, extra_env: Mapping[str, str] | None = None,
                 chunk: int = CHUNK) -> None:
        if chunk < 1:
            raise ValueError(f"chunk: {chunk}: expected at least 1 character")
        self._chunk = chunk
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

    def stream(self, argv: Sequence[str], *, timeout: float) -> Iterator[str]:
        """Standard output in chunks of ``chunk`` characters as the command prints it; the command is
        killed after ``timeout`` seconds in all (ExternalError, retryable) and a non-zero exit raises
        after the last chunk. Closing the iterator early kills the command."""
        with tempfile.TemporaryFile() as err:  # stderr to a file: a full pipe can never block the command
            try:
                proc = subprocess.Popen(list(argv), env=self._env, stdout=subprocess.PIPE, stderr=err,
                                        text=True)
            except FileNotFoundError as e:
                raise ExternalError(SYSTEM, f"{argv[0]} not found: install the Slurm client (slurm-client)",
                                    retryable=False) from e
            timer = threading.Timer(timeout, proc.kill)
            timer.start()
            try:
                assert proc.stdout is not None
                while chunk := proc.stdout.read(self._chunk):
                    yield chunk
                rc = proc.wait()
            finally:
                killed = not timer.is_alive() and proc.returncode is not None and proc.returncode < 0
                timer.cancel()
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                proc.stdout.close()  # type: ignore[union-attr]
            if killed:
                raise ExternalError(SYSTEM, f"{' '.join(argv)} did not answer within {timeout:g} s")
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        raise_for(CommandResult(tuple(argv), rc, "", stderr))


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
