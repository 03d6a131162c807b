"""Validation jobs through Slurm: ``gpufleet check`` on a drained node, with no operator.

A drained node takes no job, not even one in a reservation (seen on 22.05: ``ReqNodeNotAvail``). So
the validator first puts the node in a **maintenance reservation of its own**
(``gpufleet-validate-<node>``, ``flags=maint,ignore_jobs``, for the controller's user only), then
clears gpufleet's drain — the reservation keeps every other job off the node — and submits the check
as a batch job in that reservation, pinned to the node. The check posts its results to the
controller as check events (``gpufleet check --controller ...``); the lifecycle policy moves the
node to ready (the reconciler then deletes the reservation: the node is back in service) or back to
repair (the reconciler drains it again, then deletes the reservation).

**Pairing** (a fabric fault, ``lifecycle.validation``): the reservation also takes the known-good
partners the controller chose (idle, ready, within the budget), and ``pair_command`` runs as one job
spanning the node and its partners (``-N``, one task per node: ``srun gpufleet check --level multinode
--known-good {partners}``), so the check blames the node, never a partner. Deleting the reservation
frees the partners with the node.

A job that never starts (pending: Slurm's reason is in ``status``) is cancelled by the reconciler at the
policy's ``validation_start_timeout`` through ``cancel`` (``scancel``), and the validation fails.

Idempotent: the job carries ``gpufleet:validate=<action id>`` in its comment, and a request finds a
job already submitted for the same action instead of submitting a second one (a crash between
``sbatch`` and recording the job id). An existing reservation is reused. A node drained by someone
else is never resumed (``Conflict``, from the adapter's ownership rule).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.schedulers.port import JobState, RunStatus
from gpufleet.schedulers.slurm.adapter import SlurmScheduler
from gpufleet.schedulers.slurm.runner import CommandRunner, SubprocessRunner, raise_for

log = logging.getLogger(__name__)

RESERVATION_PREFIX = "gpufleet-validate-"
COMMENT_PREFIX = "gpufleet:validate="
LEVELS = ("quick", "full", "burnin", "multinode")
_OPEN = (JobState.PENDING, JobState.RUNNING, JobState.REQUEUED)


@dataclass(frozen=True, slots=True)
class ValidationJobs:
    """How validation jobs are submitted (``[validation]`` in controller.toml, docs/slurm.md)."""

    # The job's command; ``{node}`` and ``{level}`` are filled in (shell-quoted).
    command: str
    user: str  # the reservation's users= (the user the controller submits as)
    partition: str = ""
    time_limit: timedelta = timedelta(hours=2)
    output: str = "/tmp/gpufleet-validate-%j.out"  # sbatch -o (on the node)
    # The pairing job's command (runs once per allocation: use srun); ``{node}``, ``{partners}`` (comma
    # list) and ``{nodes}`` (node and partners) are filled in. "" = no pairing.
    pair_command: str = ""
    pair_partners: int = 1  # known-good partners per pairing validation

    def __post_init__(self) -> None:
        if "{node}" not in self.command:
            raise InvalidInput("validation.command", self.command, "a command containing {node} (and usually {level})")
        if not self.user:
            raise InvalidInput("validation.user", self.user, "the user the controller submits jobs as")
        if self.pair_command and "{partners}" not in self.pair_command:
            raise InvalidInput("validation.pair_command", self.pair_command,
                               "a command containing {partners} (for --known-good)")
        if self.pair_partners < 1:
            raise InvalidInput("validation.pair_partners", self.pair_partners, "1 or more")

    def argv(self, node: str, level: str, partners: Sequence[str] = ()) -> str:
        if level not in LEVELS:
            raise InvalidInput("level", level, f"one of {list(LEVELS)}")
        if partners:
            if not self.pair_command:
                raise InvalidInput("validation.pair_command", "", "a pairing command to validate with partners")
            return self.pair_command.format(node=shlex.quote(node), partners=shlex.quote(",".join(partners)),
                                            nodes=shlex.quote(",".join((node, *partners))))
        return self.command.format(node=shlex.quote(node), level=shlex.quote(level))


def reservation_of(node: str) -> str:
    return f"{RESERVATION_PREFIX}{node}"


class SlurmValidator:
    """The controller's ``Validator`` for Slurm (see the module docstring)."""

    def __init__(self, scheduler: SlurmScheduler, jobs: ValidationJobs, runner: CommandRunner | None = None, *,
                 slurm_conf: str | None = None, timeout: float = 30.0) -> None:
        self._sched = scheduler
        self._jobs = jobs
        self._run = runner if runner is not None else SubprocessRunner(slurm_conf)
        self._timeout = timeout

    # ---- the Validator port -------------------------------------------------------------------
    @property
    def partners(self) -> int:
        return self._jobs.pair_partners if self._jobs.pair_command else 0

    def request(self, node: str, level: str, key: str, partners: Sequence[str] = ()) -> str:
        command = self._jobs.argv(node, level, partners)
        existing = self._job_for(key)
        if existing:
            log.info("%s: validation job %s for %s already submitted", node, existing, key)
            return existing
        nodes = (node, *partners)
        self._reserve(node, nodes)
        self._sched.resume(node)  # Conflict for someone else's drain; no-op if not drained
        minutes = max(1, int(self._jobs.time_limit.total_seconds() // 60))
        argv = ["sbatch", "--parsable", "-J", f"gpufleet-validate-{level}", "-w", ",".join(nodes),
                f"--reservation={reservation_of(node)}", f"--comment={COMMENT_PREFIX}{key}",
                f"--time={minutes}", "-o", self._jobs.output]
        if partners:
            argv += ["-N", str(len(nodes)), "--ntasks-per-node=1"]
        if self._jobs.partition:
            argv += ["-p", self._jobs.partition]
        res = self._run([*argv, "--wrap", command], timeout=self._timeout)
        raise_for(res, node=node)
        job = res.stdout.strip().split(";")[0]
        log.info("%s: %s validation job %s submitted in reservation %s", node, level, job, reservation_of(node))
        return job

    def status(self, handle: str) -> RunStatus:
        try:
            job = self._sched.job(handle)
        except NotFound:
            return RunStatus(ended=f"job {handle} left the queue", cancelled=True)
        extra = dict(job.extra)
        if job.state == JobState.PENDING:
            return RunStatus(pending=extra.get("state_reason") or extra.get("slurm_state") or job.state)
        if job.state == JobState.REQUEUED:  # it started once (slurmd restarted under it): not "never started"
            return RunStatus()
        if job.state in _OPEN:
            return RunStatus()
        state = str(extra.get("slurm_state", job.state))
        return RunStatus(ended=f"job {handle} ended {state}", cancelled=state.upper().startswith("CANCELLED"))

    def cancel(self, handle: str) -> None:
        res = self._run(["scancel", handle], timeout=self._timeout)  # 22.05: rc 0 for an ended or unknown job
        try:
            raise_for(res, job=handle)
        except NotFound:
            return  # "Invalid job id specified" (other versions): gone already
        log.info("validation job %s cancelled", handle)

    def release(self, node: str) -> None:
        name = reservation_of(node)
        res = self._run(["scontrol", "delete", f"reservationname={name}"], timeout=self._timeout)
        if res.returncode != 0 and "reservation is invalid" in (res.stderr + res.stdout):
            return
        raise_for(res, node=node)
        log.info("%s: reservation %s deleted", node, name)

    def holds(self, node: str) -> bool:
        res = self._run(["scontrol", "show", "reservation", reservation_of(node)], timeout=self._timeout)
        if res.returncode != 0 and "not found" in (res.stderr + res.stdout).lower():
            return False
        raise_for(res, node=node)
        return "ReservationName=" in res.stdout

    # ---- internals ----------------------------------------------------------------------------
    def _reserve(self, node: str, nodes: Sequence[str]) -> None:
        """The node's maintenance reservation over ``nodes`` (the node and any pairing partners);
        an existing one is reused, with its nodes set to ``nodes``."""
        name, hosts = reservation_of(node), ",".join(nodes)
        if self.holds(node):
            if len(nodes) > 1:
                res = self._run(["scontrol", "update", f"reservationname={name}", f"nodes={hosts}"],
                                timeout=self._timeout)
                raise_for(res, node=node)
            return
        minutes = max(1, int(self._jobs.time_limit.total_seconds() // 60)) * 2  # queueing + the job
        argv: Sequence[str] = ["scontrol", "create", "reservation", f"reservationname={name}",
                               f"nodes={hosts}", "starttime=now", f"duration={minutes}",
                               f"users={self._jobs.user}", "flags=maint,ignore_jobs"]
        res = self._run(argv, timeout=self._timeout)
        raise_for(res, node=node)
        log.info("%s: maintenance reservation %s created over %s", node, name, hosts)

    def _job_for(self, key: str) -> str:
        token = f"{COMMENT_PREFIX}{key}"
        found = self._sched.find_jobs(lambda j: j.state in _OPEN and dict(j.extra).get("comment", "") == token)
        return found[0].id if found else ""
