"""The logic behind ``gpufleet slurm prolog|epilog|healthcheck|checkpoint`` (the CLI is a thin shell).

* **prolog** runs the node's quick check through an injected seam and refuses the node when it fails:
  it drains the node with a ``gpufleet:`` reason naming the failed check, and the hook exits 1 so
  Slurm requeues the job elsewhere. A check that cannot run at all (not installed, usage error)
  lets the job through with a warning, unless ``fail_closed``: a broken check command must not drain
  a whole partition. A check that times out counts as failed (a hung GPU looks exactly like that).
* **epilog** appends one JSON line per finished job to a local journal and never fails (a failing
  Slurm epilog drains the node).
* **healthcheck** (HealthCheckProgram) reads the agent's local status file and drains its node on a
  fatal verdict while the controller is out of reach; it says so once, in the run that drains: on a
  node already drained it is silent. A missing or stale file is reported, not acted
  on: a dead agent is not a GPU fault. A fatal verdict the agent delivered to the controller lately is
  left to the controller, whose blast-radius budget, held decisions and revalidation apply: the hook
  draining on its own bypassed them (a whole partition drained while the controller held every
  decision; a node drained again under its own validation job).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from gpufleet.domain.catalog import Catalog, load_default_catalog
from gpufleet.domain.errors import ExternalError, InvalidInput
from gpufleet.domain.nodestatus import parse_status, verdict
from gpufleet.schedulers.port import drain_reason
from gpufleet.schedulers.slurm.runner import CommandResult

log = logging.getLogger(__name__)

JOURNAL_FORMAT = "gpufleet.slurm-job/v1"


class Drainer(Protocol):
    def drain(self, node: str, reason: str) -> bool: ...  # whether it drained (False: it already was)


CheckRunner = Callable[[Sequence[str], float], CommandResult]


@dataclass(frozen=True, slots=True)
class HookOutcome:
    ok: bool  # the hook's verdict: the node may run work
    message: str  # one line for slurmd's log / the user
    drained: bool = False


# ---- prolog -------------------------------------------------------------------------------------
def _failed_checks(stdout: str) -> str:
    """A short description of the failed checks from ``gpufleet check --json`` output, if it is that."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return ""
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        return ""
    parts = []
    for r in doc["results"]:
        if isinstance(r, dict) and r.get("status") == "fail":
            where = f" gpu{r['gpu']}" if r.get("gpu") is not None else ""
            msg = r.get("message") or f"{r.get('value')} {r.get('unit', '')} (expected {r.get('expected')})"
            parts.append(f"{r.get('check', '?')}{where}: {msg}")
    return "; ".join(parts)


def _last_line(*texts: str) -> str:
    for text in texts:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return ""


def prolog(
    node: str,
    job_id: str,
    check_argv: Sequence[str],
    run_check: CheckRunner,
    drainer: Drainer,
    *,
    timeout: float = 60.0,
    fail_closed: bool = False,
) -> HookOutcome:
    """Run the quick check; on failure drain ``node`` (reason names the check) and refuse."""
    if not node:
        raise InvalidInput("node", node, "the node name (SLURMD_NODENAME or --node)")
    try:
        res = run_check(check_argv, timeout)
    except ExternalError as err:
        if "did not answer" in str(err):
            detail = f"quick check timed out after {timeout:g} s"
        elif fail_closed:
            detail = f"quick check could not run: {err}"
        else:
            return HookOutcome(True, f"gpufleet prolog: WARNING quick check could not run ({err}); job allowed")
    else:
        if res.returncode == 0:
            return HookOutcome(True, f"gpufleet prolog: {node} passed the quick check")
        if res.returncode != 1 and not fail_closed:
            why = _last_line(res.stderr, res.stdout)
            return HookOutcome(True, f"gpufleet prolog: WARNING quick check exited {res.returncode} ({why}); "
                                     "job allowed")
        detail = "quick check failed: " + (_failed_checks(res.stdout) or _last_line(res.stderr, res.stdout)
                                           or f"exit status {res.returncode}")
    reason = drain_reason(f"prolog-{job_id or 'nojob'}", detail)
    drainer.drain(node, reason)
    return HookOutcome(False, f"gpufleet prolog: refusing {node}: {reason}", drained=True)


# ---- epilog -------------------------------------------------------------------------------------
# What slurmd 22.05 puts in the epilog's environment (seen on the lab), copied into the journal.
_EPILOG_ENV = ("SLURM_JOB_ID", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_PARTITION", "SLURM_JOB_EXIT_CODE",
               "SLURM_JOB_EXIT_CODE2", "SLURM_JOB_DERIVED_EC", "SLURM_NODELIST", "SLURM_JOB_RESTART_COUNT",
               "SLURM_JOB_WORK_DIR", "SLURM_SCRIPT_CONTEXT")


def epilog_record(node: str, env: Mapping[str, str], now: datetime) -> dict[str, str]:
    """The journal line for a job that just ended on ``node`` (from the epilog's environment)."""
    rec = {"format": JOURNAL_FORMAT, "event": "job_end", "node": node, "time": now.astimezone(UTC).isoformat()}
    for key in _EPILOG_ENV:
        if key in env:
            rec[key.removeprefix("SLURM_").lower()] = env[key]
    return rec


def epilog(node: str, env: Mapping[str, str], journal: Path, now: datetime) -> HookOutcome:
    rec = epilog_record(node, env, now)
    try:
        journal.parent.mkdir(parents=True, exist_ok=True)
        with journal.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
    except OSError as err:  # never fail the epilog: Slurm would drain the node for it
        return HookOutcome(True, f"gpufleet epilog: WARNING could not write {journal}: {err}")
    return HookOutcome(True, f"gpufleet epilog: job {rec.get('job_id', '?')} ended on {node}")


# ---- healthcheck --------------------------------------------------------------------------------
def healthcheck(node: str, status_file: Path, drainer: Drainer, now: datetime, max_age: timedelta,
                catalog: Catalog | None = None, controller_fresh: timedelta = timedelta(minutes=2)) -> HookOutcome:
    """Drain ``node`` if the agent's status is fatal (and fresh and about this node) and the agent has not
    reached the controller within ``controller_fresh`` (0: drain whatever the controller; a status
    that does not say, a site script's, drains): its observations judged with ``catalog`` (the site's
    policy file's, else the shipped one)."""
    try:
        status = parse_status(status_file.read_text(encoding="utf-8"), str(status_file))
    except FileNotFoundError:
        return HookOutcome(True, f"gpufleet healthcheck: WARNING no agent status at {status_file}; nothing done")
    if status.node != node:
        return HookOutcome(True, f"gpufleet healthcheck: WARNING {status_file} is about {status.node}, not {node}")
    age = now - status.time
    if age > max_age:  # the agent is down or stuck: reported (slurmd's log), never acted on
        return HookOutcome(True, f"gpufleet healthcheck: WARNING agent status is stale: {age} old (max {max_age}); "
                                 "is the gpufleet agent running? nothing done")
    worst, reasons = verdict(status, catalog if catalog is not None else load_default_catalog())
    if worst != "fatal":
        return HookOutcome(True, f"gpufleet healthcheck: {node} {worst}")
    text = "; ".join(reasons) or "agent reports a fatal fault"
    reached = status.controller_reached
    if controller_fresh > timedelta(0) and reached is not None and now - reached <= controller_fresh:
        return HookOutcome(True, f"gpufleet healthcheck: {node} fatal ({text}); left to the controller, which the "
                                 f"agent reached {max(timedelta(0), now - reached)} ago (its budget and held "
                                 "decisions apply); not drained here")
    reason = drain_reason(status.decision or "healthcheck", text)
    if not drainer.drain(node, reason):
        # Already drained (by this hook's last run, the controller or an operator; the reason there is
        # kept): nothing changed, so nothing is said. slurmd runs the hook every HealthCheckInterval and
        # logs a non-zero exit with its output: a drained node must not fill its log.
        return HookOutcome(True, "")
    return HookOutcome(False, f"gpufleet healthcheck: drained {node}: {reason}", drained=True)
