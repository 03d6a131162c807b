"""Push a run's goodput to the controller: final intervals and straggler findings (best effort).

The run directory stays the source of truth and is the only spool: each round reads the run's logs,
computes its final intervals (:mod:`gpufleet.goodput.intervals`) and posts those after the last one the
controller acknowledged (``POST /v1/jobs/{job}/goodput``, at most ``batch`` per request and
``max_per_round`` per round). A round that fails (controller down, 5xx, timeout) is counted in
``failed_posts`` and dropped; the next round computes the same intervals again, so nothing is lost
while the run directory exists, and nothing is held in memory. A re-sent interval is a duplicate at
the controller, never counted twice. Straggler findings (:mod:`gpufleet.goodput.straggler`) are posted
once each as ``check_failed``/``straggler`` events through ``POST /v1/events`` (the agents' event path;
the controller judges them) and remembered in ``RUN_DIR/goodput-push.json``.

Training never waits for any of this: :class:`gpufleet.goodput.durable.RunRecorder` starts the pusher as
a separate low-priority process on rank 0 (``python -m gpufleet.goodput.push RUN_DIR --follow --parent
PID``) when ``$GPUFLEET_CONTROLLER`` is set; it pushes every ``period`` seconds and once more after the
training process exits. ``gpufleet goodput push RUN_DIR`` does one round by hand.

The other way, :func:`fetch_job_events` reads what happened to the job's nodes (``GET
/v1/jobs/{job}/events``) for the experiment trackers (:mod:`gpufleet.goodput.trackers`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.domain.durations import positive_seconds
from gpufleet.domain.errors import ExternalError, GpufleetError, InvalidInput
from gpufleet.goodput.durable import read_run
from gpufleet.goodput.intervals import Interval, run_intervals
from gpufleet.goodput.runreport import run_report
from gpufleet.goodput.straggler import straggler_event
from gpufleet.goodput.trackers import InfraEvent

log = logging.getLogger(__name__)
STATE_FILE = "goodput-push.json"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def interval_doc(i: Interval) -> dict[str, Any]:
    """The wire form of one interval (``POST /v1/jobs/{job}/goodput``, docs/api.md)."""
    doc: dict[str, Any] = {"start": _iso(i.start), "end": _iso(i.end), "productive_s": i.productive,
                           "badput_s": {k: v for k, v in i.badput.as_dict().items() if v},
                           "steps": i.steps, "step_s": i.step_s}
    if i.flops is not None and i.peak_flops:
        doc["flops"], doc["peak_flops"] = i.flops, i.peak_flops
    return doc


@dataclass
class PushCounts:
    rounds: int = 0
    accepted: int = 0
    duplicates: int = 0
    conflicts: int = 0  # records the controller holds with other values (409): skipped for good
    refused: int = 0  # records the controller refused (422, e.g. a straggler on a node it does not know): skipped
    # this round; a refused interval is not sent again (it cannot change), a refused straggler is (next round)
    failed_posts: int = 0  # posts that failed and were dropped (sent again next round)
    stragglers_posted: int = 0


class GoodputPusher:
    def __init__(self, run_dir: str | Path, controller: str, token: str, *, job: str = "", run: str = "",
                 batch: int = 500, max_per_round: int = 5000, timeout_s: float = 5.0) -> None:
        if not controller.startswith(("http://", "https://")):
            raise InvalidInput("GPUFLEET_CONTROLLER", controller, "an http:// or https:// URL")
        if not 1 <= batch <= 1000:
            raise InvalidInput("batch", batch, "1 to 1000 intervals per request (the controller's bound)")
        self.run_dir = Path(run_dir)
        self.base = controller.rstrip("/")
        self.job, self.run = job, run or self.run_dir.resolve().name
        self.batch, self.max_per_round, self.timeout_s = batch, max_per_round, timeout_s
        self._headers = {"Authorization": f"Bearer {token}"}
        self.acked_until = float("-inf")  # end of the last interval the controller acknowledged
        self.counts = PushCounts()

    @classmethod
    def from_env(cls, run_dir: str | Path) -> GoodputPusher | None:
        """From ``$GPUFLEET_CONTROLLER`` and ``$GPUFLEET_TOKEN_FILE`` (None when no controller is set)."""
        url, token_file = os.environ.get("GPUFLEET_CONTROLLER", ""), os.environ.get("GPUFLEET_TOKEN_FILE", "")
        if not url:
            return None
        try:
            token = Path(token_file).read_text("utf-8").strip() if token_file else ""
        except OSError as err:
            raise InvalidInput("GPUFLEET_TOKEN_FILE", token_file, f"a readable token file ({err.strerror})") from None
        if not token:
            raise InvalidInput("GPUFLEET_TOKEN_FILE", token_file, "a file holding the controller's bearer token")
        return cls(run_dir, url, token, job=os.environ.get("SLURM_JOB_ID", ""))

    def push_once(self) -> PushCounts:
        """One round: new final intervals, then new straggler findings. Never raises for the controller."""
        import httpx

        self.counts.rounds += 1
        try:
            logs = read_run(self.run_dir)
        except GpufleetError as err:
            log.warning("goodput push: cannot read %s: %s", self.run_dir, err)
            return self.counts
        lead = min(logs, key=lambda lg: lg.rank)
        job = self.job or next((a.job for a in reversed(lead.attempts) if a.job), "")
        if not job:
            log.warning("goodput push: no job id (set SLURM_JOB_ID or --job); nothing sent")
            return self.counts
        world = lead.attempts[-1].world
        todo = [i for i in run_intervals(lead) if i.start >= self.acked_until][: self.max_per_round]
        with httpx.Client(timeout=self.timeout_s, headers=self._headers) as client:
            for n in range(0, len(todo), self.batch):
                chunk = todo[n:n + self.batch]
                body = {"run": self.run, "world": world, "intervals": [interval_doc(i) for i in chunk]}
                got = self._post(client, f"/v1/jobs/{job}/goodput", body, len(chunk))
                if got is None:
                    return self.counts  # the controller is not taking posts: the rest waits for next round
                doc = got[1]
                self.counts.accepted += int(doc.get("accepted", 0))
                self.counts.duplicates += int(doc.get("duplicates", 0))
                self.acked_until = chunk[-1].end
            if len(logs) > 1:
                self._stragglers(client, job, logs)
        return self.counts

    def _post(self, client: Any, path: str, body: dict[str, Any], n: int) -> tuple[int, dict[str, Any]] | None:
        """(status, the controller's answer): 202 and its body, or 409 / 422 and {} (counted, skipped);
        None when the post failed (no answer, or another status)."""
        import httpx

        try:
            resp = client.post(self.base + path, json=body)
        except httpx.HTTPError as err:
            self.counts.failed_posts += 1
            log.warning("goodput push to %s failed: %s (sent again next round; training goes on)", path, err)
            return None
        if resp.status_code in (409, 422):  # the same body again would get the same answer: skip it, say so
            if resp.status_code == 409:
                self.counts.conflicts += n
            else:
                self.counts.refused += n
            log.error("goodput push to %s answered %s: %s; skipping these %d records", path, resp.status_code,
                      resp.text[:300], n)
            return resp.status_code, {}
        if resp.status_code != 202:
            self.counts.failed_posts += 1
            log.warning("goodput push to %s answered %s: %s", path, resp.status_code, resp.text[:300])
            return None
        doc: dict[str, Any] = resp.json()
        return 202, doc

    def _stragglers(self, client: Any, job: str, logs: list[Any]) -> None:
        state_path = self.run_dir / STATE_FILE
        try:
            state = json.loads(state_path.read_text("utf-8")) if state_path.exists() else {}
        except (OSError, ValueError):
            state = {}
        posted: list[str] = list(state.get("stragglers_posted", []))
        for s in run_report(logs).stragglers:
            key = f"{s.rank}@{s.host}"
            if key in posted or not s.host:
                continue
            e = straggler_event(s, job=job, time=datetime.now(UTC), run=self.run)
            doc = {"id": e.id, "node": e.node, "kind": e.kind.value, "time": e.time.isoformat(),
                   "component": e.component, "message": e.message, "source": e.source, "attrs": dict(e.attrs)}
            got = self._post(client, "/v1/events", {"events": [doc]}, 1)
            # 409: the controller has this event already. A 422 (its node not registered yet, say) is sent
            # again next round, not remembered as posted.
            if got is not None and got[0] in (202, 409):
                posted.append(key)
                self.counts.stragglers_posted += 1
                tmp = state_path.with_suffix(".tmp")
                tmp.write_text(json.dumps({"stragglers_posted": posted}), "utf-8")
                os.replace(tmp, state_path)

    def follow(self, stop: threading.Event, *, period_s: float = 60.0, parent_pid: int | None = None,
               poll_s: float = 1.0) -> None:
        """Push every ``period_s`` until ``stop`` is set or ``parent_pid`` has exited, then once more."""
        positive_seconds(period_s, "period_s")
        next_at = time.monotonic() + period_s
        while not stop.wait(min(poll_s, period_s)):
            if parent_pid is not None and not _alive(parent_pid):
                break
            if time.monotonic() >= next_at:
                self.push_once()
                next_at = time.monotonic() + period_s
        self.push_once()


def controller_token(token_file: str | Path) -> str:
    """The bearer token in ``token_file`` (``$GPUFLEET_TOKEN_FILE``, ``--token-file``)."""
    try:
        token = Path(token_file).read_text("utf-8").strip() if str(token_file) else ""
    except OSError as err:
        raise InvalidInput("token_file", str(token_file), f"a readable token file ({err.strerror})") from None
    if not token:
        raise InvalidInput("token_file", str(token_file), "a file holding the controller's bearer token")
    return token


def fetch_job_events(controller: str, token: str, job: str, *, nodes: Sequence[str] = (),
                     since: float | None = None, until: float | None = None, limit: int = 1000,
                     timeout_s: float = 5.0) -> tuple[list[InfraEvent], bool]:
    """``GET /v1/jobs/{job}/events``: the infrastructure events on the job's nodes (``nodes``, or the
    ones the scheduler runs it on now) in ``[since, until)`` (Unix seconds), oldest first, and whether
    the controller cut the list at ``limit``. Raises :class:`ExternalError` when the controller cannot
    answer, :class:`InvalidInput` for a bad URL or job."""
    import httpx

    if not controller.startswith(("http://", "https://")):
        raise InvalidInput("controller", controller, "an http:// or https:// URL")
    if not job:
        raise InvalidInput("job", job, "the job id the controller knows (e.g. the Slurm job id)")
    params: list[tuple[str, str | int | float | bool | None]] = [("node", n) for n in sorted(set(nodes))]
    params.append(("limit", limit))
    params += [(k, _iso(v)) for k, v in (("since", since), ("until", until)) if v is not None]
    url = f"{controller.rstrip('/')}/v1/jobs/{job}/events"
    try:
        resp = httpx.get(url, params=params, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise ExternalError("controller", f"GET {url}: {type(err).__name__}: {err}") from err
    if resp.status_code != 200:
        raise ExternalError("controller", f"GET {url} answered {resp.status_code}: {resp.text[:300]}",
                            retryable=resp.status_code >= 500)
    doc = resp.json()
    return [InfraEvent.from_doc(e) for e in doc.get("events", [])], bool(doc.get("truncated"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str] | None = None) -> int:
    """The sidecar: ``python -m gpufleet.goodput.push RUN_DIR [--follow] [--parent PID] [--period S]``."""
    p = argparse.ArgumentParser(prog="python -m gpufleet.goodput.push")
    p.add_argument("run_dir")
    p.add_argument("--follow", action="store_true")
    p.add_argument("--parent", type=int, default=None)
    p.add_argument("--period", type=float, default=60.0)
    a = p.parse_args(argv)
    try:
        positive_seconds(a.period, "--period")  # 0 would push in a tight loop
    except InvalidInput as err:
        p.error(str(err))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s goodput-push %(levelname)s %(message)s")
    pusher = GoodputPusher.from_env(a.run_dir)
    if pusher is None:
        log.error("GPUFLEET_CONTROLLER is not set: nothing to push to")
        return 2
    if a.follow:
        os.nice(10)  # behind the training processes for the CPU
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the recorder closed: push once more, exit
        pusher.follow(stop, period_s=a.period, parent_pid=a.parent)
    else:
        pusher.push_once()
    log.info("goodput push: %s", pusher.counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
