"""The checkpoint-request contract between the controller and a training job.

When the controller wants a checkpoint *now* (a node it is about to drain runs the job), it has
Slurm signal the job's processes (``scancel --signal=USR1 --full <job>``; default signal ``USR1``,
``$GPUFLEET_CHECKPOINT_SIGNAL`` overrides it by name). In the job:

1. :class:`CheckpointRequest` (installed by :class:`gpufleet.goodput.torch_checkpoint.Checkpointer`)
   only sets a flag in the handler; nothing else happens inside the signal handler.
2. At the next step boundary the ranks agree (any rank that saw the signal makes all of them save) and
   start an asynchronous checkpoint, recorded in the run log.
3. When the checkpoint is durable, rank 0 reports it: ``POST {controller}/v1/jobs/{SLURM_JOB_ID}/checkpoint``
   with ``{"time": "<ISO 8601 UTC>"}`` (:class:`ControllerReporter`, from ``$GPUFLEET_CONTROLLER`` and
   ``$GPUFLEET_TOKEN_FILE``). The controller's checkpoint-aware drain then proceeds. A report that fails
   is logged and dropped: training never stops for the controller.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.domain.errors import InvalidInput

log = logging.getLogger(__name__)
DEFAULT_SIGNAL = "USR1"


class CheckpointRequest:
    def __init__(self, signame: str | None = None) -> None:
        name = (signame or os.environ.get("GPUFLEET_CHECKPOINT_SIGNAL") or DEFAULT_SIGNAL).upper()
        name = name if name.startswith("SIG") else f"SIG{name}"
        try:
            self.signum = signal.Signals[name]
        except KeyError:
            raise InvalidInput("GPUFLEET_CHECKPOINT_SIGNAL", signame or name, "a signal name such as USR1") from None
        self._flag = threading.Event()

    def install(self) -> CheckpointRequest:
        """Handle the signal (call from the main thread, before training)."""
        signal.signal(self.signum, self._handler)
        return self

    def _handler(self, signum: int, frame: object) -> None:
        self._flag.set()

    def ask(self) -> None:
        """Request a checkpoint from code (what the signal does)."""
        self._flag.set()

    def take(self) -> bool:
        """True once per request: whether a checkpoint was asked for since the last call."""
        if self._flag.is_set():
            self._flag.clear()
            return True
        return False


class ControllerReporter:
    """Tells the controller a checkpoint is durable (``POST /v1/jobs/{job}/checkpoint``)."""

    def __init__(self, controller: str, token: str, job: str, *, timeout_s: float = 5.0) -> None:
        if not controller.startswith(("http://", "https://")):
            raise InvalidInput("GPUFLEET_CONTROLLER", controller, "an http:// or https:// URL")
        if not job:
            raise InvalidInput("SLURM_JOB_ID", job, "the job id the controller knows the job by")
        self.url = f"{controller.rstrip('/')}/v1/jobs/{job}/checkpoint"
        self._token = token
        self._timeout = timeout_s

    @classmethod
    def from_env(cls) -> ControllerReporter | None:
        url, token_file = os.environ.get("GPUFLEET_CONTROLLER", ""), os.environ.get("GPUFLEET_TOKEN_FILE", "")
        if not url:
            return None
        try:
            token = Path(token_file).read_text("utf-8").strip() if token_file else ""
        except OSError as err:
            raise InvalidInput("GPUFLEET_TOKEN_FILE", token_file, f"a readable token file ({err.strerror})") from None
        if not token:
            raise InvalidInput("GPUFLEET_TOKEN_FILE", token_file, "a file holding the controller's bearer token")
        return cls(url, token, os.environ.get("SLURM_JOB_ID", ""))

    def checkpointed(self, at: float) -> bool:
        """Report a checkpoint durable at Unix time ``at``; False (logged) when the controller did not take it."""
        import httpx

        stamp = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
        try:
            resp = httpx.post(self.url, json={"time": stamp}, headers={"Authorization": f"Bearer {self._token}"},
                              timeout=self._timeout)
        except httpx.HTTPError as err:
            log.warning("checkpoint report to %s failed: %s (training goes on)", self.url, err)
            return False
        if resp.status_code != 202:
            log.warning("checkpoint report to %s answered %s: %s", self.url, resp.status_code, resp.text[:200])
            return False
        return True
