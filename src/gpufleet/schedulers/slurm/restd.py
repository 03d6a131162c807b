"""Reading node and job lists from slurmrestd (openapi v0.0.38) instead of forking sinfo/squeue.

Useful where the controller does not run on a Slurm host (no client binaries, no munge key): the
documents are the same schema as ``sinfo --json`` / ``squeue --json``, so the same parsers apply.
Writes still need ``scontrol``: slurmrestd 22.05 cannot change a node (``POST node/{name}`` is 405).

Two transports: a unix socket with ``rest_auth/local`` (what the lab runs), or TCP with JWT
(``X-SLURM-USER-NAME`` + ``X-SLURM-USER-TOKEN``, token from ``scontrol token``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

import httpx

from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.schedulers.port import Job
from gpufleet.schedulers.slurm.parse import is_job_id, is_running, jobs_from_squeue, stream_jobs
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
        _raise_for_status(path, resp.status_code, resp.text)
        return resp.text

    def _stream(self, path: str) -> Iterator[str]:
        try:
            with self._client.stream("GET", API + path) as resp:
                if resp.status_code >= 400:
                    _raise_for_status(path, resp.status_code, resp.read().decode(errors="replace"))
                yield from resp.iter_text()
        except httpx.HTTPError as err:
            raise ExternalError(SYSTEM, f"slurmrestd GET {path}: {err}") from err

    def nodes_json(self) -> str:
        return self._get("/nodes")

    def jobs(self, keep: Callable[[Job], bool] | None = None) -> list[Job]:
        return stream_jobs(self._stream("/jobs"), keep, what="slurmrestd /jobs")

    def jobs_by_id(self, ids: Collection[str]) -> list[Job]:
        """``GET /job/{id}`` for each: slurmctld loads that job alone. A job Slurm no longer knows is
        left out (22.05 answers HTTP 500 with ``Invalid job id specified``)."""
        out: list[Job] = []
        for job_id in dict.fromkeys(ids):
            if not is_job_id(job_id):
                continue
            try:
                resp = self._client.get(f"{API}/job/{job_id}")
            except httpx.HTTPError as err:
                raise ExternalError(SYSTEM, f"slurmrestd GET /job/{job_id}: {err}") from err
            if resp.status_code == 500 and "Invalid job id specified" in resp.text:
                continue
            _raise_for_status(f"/job/{job_id}", resp.status_code, resp.text)
            out.extend(jobs_from_squeue(resp.text))
        return out

    def running(self) -> list[tuple[str, tuple[str, ...]]]:
        """slurmrestd 22.05 cannot filter jobs by state: this streams the whole queue, keeping the running
        jobs only (docs/slurm.md)."""
        return [(j.id, j.nodes) for j in self.jobs(is_running)]

    def close(self) -> None:
        self._client.close()


def _raise_for_status(path: str, status: int, text: str) -> None:
    if status >= 500:
        raise ExternalError(SYSTEM, f"slurmrestd GET {path}: HTTP {status}")
    if status >= 400:
        raise ExternalError(SYSTEM, f"slurmrestd GET {path}: HTTP {status} {text[:200]}", retryable=False)
