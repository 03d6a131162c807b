"""Reading node and job lists from slurmrestd (openapi v0.0.38) instead of forking sinfo/squeue.

Useful where the controller does not run on a Slurm host (no client binaries, no munge key): the
documents are the same schema as ``sinfo --json`` / ``squeue --json``, so the same parsers apply.
Writes still need ``scontrol``: slurmrestd 22.05 cannot change a node (``POST node/{name}`` is 405).

Two transports: a unix socket with ``rest_auth/local`` (what the lab runs), or TCP with JWT
(``X-SLURM-USER-NAME`` + ``X-SLURM-USER-TOKEN``, token from ``scontrol token``).
"""

from __future__ import annotations

import httpx

from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.schedulers.slurm.parse import jobs_from_squeue, running_from_jobs
from gpufleet.schedulers.slurm.runner import SYSTEM

API = "/slurm/v0.0.38"


class RestReader:
    """A :class:`~gpufleet.schedulers.slurm.adapter.StateReader` over slurmrestd."""

    def __init__(self, *, socket: str | None = None, url: str | None = None, user: str = "",
                 token: str = "", timeout: float = 10.0) -> None:
        if (socket is None) == (url is None):
            raise InvalidInput("slurmrestd", {"socket": socket, "url": url}, "exactly one of socket or url")
        headers = {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": token} if token else {}
        transport = httpx.HTTPTransport(uds=socket) if socket else None
        self._client = httpx.Client(base_url=url or "http://slurmrestd", transport=transport, headers=headers,
                                    timeout=timeout)

    def _get(self, path: str) -> str:
        try:
            resp = self._client.get(API + path)
        except httpx.HTTPError as err:
            raise ExternalError(SYSTEM, f"slurmrestd GET {path}: {err}") from err
        if resp.status_code >= 500:
            raise ExternalError(SYSTEM, f"slurmrestd GET {path}: HTTP {resp.status_code}")
        if resp.status_code >= 400:
            raise ExternalError(SYSTEM, f"slurmrestd GET {path}: HTTP {resp.status_code} {resp.text[:200]}",
                                retryable=False)
        return resp.text

    def nodes_json(self) -> str:
        return self._get("/nodes")

    def jobs_json(self) -> str:
        return self._get("/jobs")

    def running(self) -> list[tuple[str, tuple[str, ...]]]:
        """slurmrestd 22.05 cannot filter jobs by state: this reads the whole queue (docs/slurm.md)."""
        return running_from_jobs(jobs_from_squeue(self.jobs_json()))

    def close(self) -> None:
        self._client.close()
