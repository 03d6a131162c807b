"""The Slurm scheduler adapter: :class:`~gpufleet.schedulers.port.Scheduler` over Slurm's own CLI.

Reads go through ``sinfo --json`` / ``squeue --json`` (or slurmrestd, same schema: see
:mod:`gpufleet.schedulers.slurm.restd`) and ``scontrol show node``; every change goes through
``scontrol`` (slurmrestd 22.05 cannot change a node's state) or ``scancel``.

How the port's contract maps onto Slurm:

* **Ownership.** gpufleet's drains carry a reason starting with ``gpufleet:``. ``drain`` reads the
  node first: a node that already has the DRAIN flag is left as it is (ours: idempotent; someone
  else's: their reason is kept and reported through ``SchedNode.foreign_drain``). A node that is DOWN
  without the DRAIN flag (an operator's ``state=down``, or Slurm's own "Not responding") is drained with
  gpufleet's reason followed by the one it replaces (``<gpufleet's>; before: <theirs>``, decision 0131):
  the DRAIN flag keeps the node out when it comes back up (``ReturnToService``). ``resume`` clears
  only a drain or DOWN whose reason starts with the prefix, and raises ``Conflict`` otherwise.
  Slurm has no compare-and-set on a node's reason, so there is a window of one command between the
  read and the write; an operator who re-drains a node inside it is the only way to lose a reason.
* **Failures.** A controller that does not answer (``Unable to contact slurm controller``, a JSON
  document whose ``errors`` list is not empty, a command time-out) is ``ExternalError`` (retryable);
  ``Invalid node name`` / ``Node X not found`` / ``Invalid job id`` are ``NotFound``.
* **Drains survive a slurmctld crash.** slurmctld acknowledges ``scontrol update state=drain`` at
  once but writes its node state file up to a few seconds later (3.5 s measured on the lab), so a
  crash in that window silently forgets the drain. The adapter remembers the drains it issued and
  the controller's ``BOOT_TIME`` at that moment; when a later ``list_nodes`` (every reconciler pass)
  finds such a node without its DRAIN flag *and* slurmctld has rebooted since, it drains it again
  (WARNING). If slurmctld did not reboot, someone resumed the node on purpose: that is respected
  and the drain is forgotten.
* **Checkpoint requests (opt-in).** ``request_checkpoint`` runs ``scancel --signal=<sig>
  [--batch|--full] J`` with the signal the job declared in its comment (``gpufleet:signal=USR1``),
  else the site-wide ``checkpoint_signal`` given at construction (default ``""``: none), and sends
  nothing to a job with neither (it is drained at the deadline). ``checkpoint_target``: ``full`` =
  batch shell and every step (default), ``batch`` = the batch shell only, ``steps`` = the job steps
  only. The training script's side of it is in docs/slurm.md.
* **Requeue.** ``scontrol requeue`` only for a job that is running; a job that is already pending
  (requeued) is left alone, which makes a retried requeue a no-op. Slurm keeps a requeued job
  ineligible for ~121 s (``EligibleTime``); ``start_now`` (or ``requeue_starts_now=True``) lifts that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Protocol

from gpufleet.domain.errors import Conflict, ExternalError, InvalidInput, NotFound
from gpufleet.schedulers.port import REASON_PREFIX, Job, JobState, SchedNode, keeping_reason
from gpufleet.schedulers.slurm.checkpoint import signal_name, with_checkpoint
from gpufleet.schedulers.slurm.parse import (
    PLACE_LAST_WEIGHT,
    RUNNING_STATES,
    SlurmNode,
    is_job_id,
    job_from_record,
    node_from_scontrol,
    nodes_from_sinfo,
    record_from_scontrol,
    running_from_squeue_text,
    stream_jobs,
)
from gpufleet.schedulers.slurm.runner import CommandResult, CommandRunner, SubprocessRunner, raise_for, stream_output

log = logging.getLogger(__name__)

_ALREADY_OFF = ("Job is pending execution", "already completing or completed")
_MAX_REASON = 1000  # Slurm accepts long reasons; keep ours bounded and on one line


class StateReader(Protocol):
    """Where node and job lists come from: the CLI (default) or slurmrestd.

    Every read's cost in the controller must not grow with the queue: 100,000 queued jobs are about
    300 MB of ``squeue --json``, and Slurm 22.05 filters none of it (``squeue --json`` ignores
    ``--states``/``--jobs``; slurmrestd's ``/jobs`` takes no filter). So:

    * ``running`` (every reconciler pass: which jobs run on which nodes) is the running jobs' ids and
      nodes only: the CLI asks ``squeue`` in its text form, which does filter;
    * ``jobs(keep)`` streams the whole queue record by record and keeps only what ``keep`` accepts,
      so memory follows what is kept, not the queue (the CPU cost does follow the queue);
    * ``jobs_by_id`` is a few named jobs (acting on a job, a checkpoint report), each read on its own:
      slurmctld loads that job alone (``scontrol show job J``; slurmrestd ``GET /job/{id}``). A job
      Slurm no longer knows is left out.
    """

    def nodes_json(self) -> str: ...

    def jobs(self, keep: Callable[[Job], bool] | None = None) -> list[Job]: ...

    def jobs_by_id(self, ids: Collection[str]) -> list[Job]: ...

    def running(self) -> list[tuple[str, tuple[str, ...]]]: ...


class CliReader:
    """Reads through ``sinfo --json`` and ``squeue`` (``--json`` streamed; text for the running jobs)."""

    def __init__(self, runner: CommandRunner, timeout: float) -> None:
        self._run, self._timeout = runner, timeout

    def nodes_json(self) -> str:
        res = self._run(["sinfo", "--json"], timeout=self._timeout)
        raise_for(res)
        return res.stdout

    def jobs(self, keep: Callable[[Job], bool] | None = None) -> list[Job]:
        return stream_jobs(stream_output(self._run, ["squeue", "--json"], timeout=self._timeout), keep)

    def jobs_by_id(self, ids: Collection[str]) -> list[Job]:
        out = []
        for job_id in dict.fromkeys(ids):
            if not is_job_id(job_id):  # not a Slurm job id: no such job (and never an option to scontrol)
                continue
            res = self._run(["scontrol", "show", "job", job_id], timeout=self._timeout)
            try:
                raise_for(res, job=job_id)
            except NotFound:
                continue
            out.append(job_from_record(record_from_scontrol(res.stdout, job_id)))
        return out

    def running(self) -> list[tuple[str, tuple[str, ...]]]:
        # %A: the job's own id (unique per array task, as squeue --json's job_id); %N: its nodes
        res = self._run(["squeue", "--noheader", f"--states={RUNNING_STATES}", "--format=%A|%N"],
                        timeout=self._timeout)
        raise_for(res)
        return running_from_squeue_text(res.stdout)


def _clean_reason(reason: str) -> str:
    text = " ".join(reason.split())
    if not text:
        raise InvalidInput("reason", reason, "a non-empty drain reason")
    return text[:_MAX_REASON]


CHECKPOINT_TARGETS = {"full": ("--full",), "batch": ("--batch",), "steps": ()}


class SlurmScheduler:
    """The Slurm implementation of the scheduler port, plus Slurm-only operations (hold, release,
    features, weights, checkpoint tokens)."""

    name = "slurm"

    def __init__(
        self,
        runner: CommandRunner | None = None,
        *,
        slurm_conf: str | None = None,
        reader: StateReader | None = None,
        timeout: float = 30.0,
        requeue_starts_now: bool = False,
        checkpoint_signal: str = "",
        checkpoint_target: str = "full",
    ) -> None:
        if checkpoint_target not in CHECKPOINT_TARGETS:
            raise InvalidInput("checkpoint_signal_target", checkpoint_target, f"one of {sorted(CHECKPOINT_TARGETS)}")
        # The site-wide default for jobs that declared no signal of their own; "": ask only those that did.
        self._ckpt_signal = signal_name(checkpoint_signal) if checkpoint_signal else ""
        self._ckpt_target = CHECKPOINT_TARGETS[checkpoint_target]
        self._run = runner if runner is not None else SubprocessRunner(slurm_conf)
        self._timeout = timeout
        self._reader = reader if reader is not None else CliReader(self._run, timeout)
        self._requeue_starts_now = requeue_starts_now
        self._issued: dict[str, tuple[str, str]] = {}  # node -> (reason, slurmctld BOOT_TIME when drained)

    # ---- reads --------------------------------------------------------------------------------
    def slurm_nodes(self) -> list[SlurmNode]:
        return nodes_from_sinfo(self._reader.nodes_json())

    def slurm_node(self, name: str) -> SlurmNode:
        res = self._scontrol(["show", "node", name], node=name)
        return node_from_scontrol(res.stdout, name)

    def list_nodes(self, *, jobs: bool = True) -> Sequence[SchedNode]:
        """Every node (``sinfo --json``); with ``jobs``, the ids of the jobs running on each too (the
        running jobs' text read: cheap for the controller, but slurmctld packs and ``squeue`` loads every
        queued job for it). Without, the state alone says whether a node is busy."""
        nodes = self.slurm_nodes()
        if self._issued and self._reassert_lost_drains(nodes):
            nodes = self.slurm_nodes()
        if not jobs:
            return [n.view() for n in nodes]
        by_node = self._running_by_node(self._reader.running())
        return [n.view(by_node.get(n.name, ())) for n in nodes]

    def node(self, name: str) -> SchedNode:
        n = self.slurm_node(name)
        return n.view(self._running_by_node(self._reader.running()).get(name, ()))

    def list_jobs(self) -> Sequence[Job]:
        """Every job in the queue: as many objects as jobs (the web UI's list). The controller's own
        paths read only the jobs they act on (:meth:`job`, :meth:`jobs_on`)."""
        return self._reader.jobs()

    def find_jobs(self, keep: Callable[[Job], bool]) -> list[Job]:
        """The jobs ``keep`` accepts, the queue read record by record (memory follows what is kept)."""
        return self._reader.jobs(keep)

    def job(self, job_id: str) -> Job:
        for j in self._reader.jobs_by_id([job_id]):
            if j.id == job_id:
                return j
        raise NotFound("job", job_id)

    def jobs_on(self, node: str) -> Sequence[Job]:
        ids = self._running_by_node(self._reader.running()).get(node, ())
        jobs = [j for j in self._reader.jobs_by_id(ids) if j.state == JobState.RUNNING and node in j.nodes]
        if not jobs:
            self.slurm_node(node)  # NotFound for a node Slurm does not know
        return jobs

    # ---- node changes -------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> bool:
        text = _clean_reason(reason)
        current = self.slurm_node(node)
        if current.drain_flag:
            if not current.reason.startswith(REASON_PREFIX):
                log.info("%s: already drained by someone else (%r); keeping their reason", node, current.reason)
            return False
        if current.base_state == "down":  # Slurm would replace their reason with ours: keep it after ours
            text = _clean_reason(keeping_reason(text, current.reason))
        self._scontrol(["update", f"nodename={node}", "state=drain", f"reason={text}"], node=node)
        log.info("%s: drained in slurm: %s", node, text)
        try:
            boot = self._boot_time()
        except ExternalError:  # the drain itself went through; without a boot time it is never re-asserted
            boot = ""
        self._issued[node] = (text, boot)
        return True

    def resume(self, node: str) -> None:
        current = self.slurm_node(node)
        if not current.drain_flag and current.base_state != "down":
            return
        if not current.reason.startswith(REASON_PREFIX):
            raise Conflict(
                f"node {node} is {current.slurm_state} with reason {current.reason!r} set by "
                f"{current.reason_user or 'someone else'}; gpufleet resumes only nodes it drained"
            )
        res = self._run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout=self._timeout)
        # A node without a live slurmd: Slurm clears DRAIN but refuses the IDLE part ("Invalid node
        # state specified", seen on 22.05 for nodes that never registered). Accept it if the flag is gone.
        if (res.returncode != 0 and "Invalid node state specified" in res.stderr
                and not self.slurm_node(node).drain_flag):
            log.info("%s: resumed (drain cleared; node not responding)", node)
            self._issued.pop(node, None)
            return
        raise_for(res, node=node)
        self._issued.pop(node, None)
        log.info("%s: resumed in slurm (was %r)", node, current.reason)

    def set_features(self, node: str, features: Sequence[str]) -> None:
        """Set a node's available and active features (``scontrol update ... features=``)."""
        bad = [f for f in features if not f or any(c in f for c in ", \t\n")]
        if bad:
            raise InvalidInput("features", list(features), "feature names without commas or spaces")
        joined = ",".join(features)
        self._scontrol(["update", f"nodename={node}", f"availablefeatures={joined}",
                        f"activefeatures={joined}"], node=node)

    def set_weight(self, node: str, weight: int) -> None:
        """Set a node's scheduling weight (lower weights are allocated first)."""
        if not 0 <= weight < 2**32 - 1:
            raise InvalidInput("weight", weight, "an integer from 0 to 4294967294")
        self._scontrol(["update", f"nodename={node}", f"weight={weight}"], node=node)

    def place_last(self, node: str, last: bool) -> None:
        """Keep ``node`` last in placement (or not) by its weight (parse.PLACE_LAST_WEIGHT); idempotent.

        Slurm forgets weights set with scontrol at ``scontrol reconfigure`` and restarts; the
        controller sets it again on its next pass (it compares ``placed_last`` with the node's state)."""
        n = self.slurm_node(node)
        if n.placed_last == last:
            return
        self.set_weight(node, n.weight + PLACE_LAST_WEIGHT if last else n.weight - PLACE_LAST_WEIGHT)
        log.info("%s: weight %d -> %d (%s)", node, n.weight,
                 n.weight + PLACE_LAST_WEIGHT if last else n.weight - PLACE_LAST_WEIGHT,
                 "placed last: suspect" if last else "placed normally again")

    def set_partition_nodes(self, partition: str, nodes: Sequence[str]) -> None:
        """Make ``nodes`` the partition's whole node list (``scontrol update partitionname=P nodes=...``).

        The hot-spare pools' lever (controller.spares): a spare leaves the big partition and joins the
        backfill one, and back. Like weights, Slurm forgets it at ``scontrol reconfigure`` and restarts
        (slurm.conf's ``Nodes=`` wins); the controller sets it again on its next pass."""
        if not partition or any(c in partition for c in ", \t\n="):
            raise InvalidInput("partition", partition, "a Slurm partition name")
        bad = [n for n in nodes if not n or any(c in n for c in ", \t\n=")]
        if bad:
            raise InvalidInput("nodes", list(nodes), "node names without commas, spaces or '='")
        self._scontrol(["update", f"partitionname={partition}", f"nodes={','.join(nodes)}"])
        log.info("partition %s: nodes %s", partition, ",".join(nodes) or "(none)")

    def reconfigure(self) -> None:
        """``scontrol reconfigure``: slurmctld re-reads its configuration files (topology.conf among them)."""
        self._scontrol(["reconfigure"])

    # ---- job changes --------------------------------------------------------------------------
    def requeue(self, job_id: str) -> None:
        job = self.job(job_id)
        if job.state != JobState.RUNNING:
            log.info("job %s: not running (%s); requeue is a no-op", job_id, job.state)
            return
        res = self._run(["scontrol", "requeue", job_id], timeout=self._timeout)
        if res.returncode != 0 and any(t in res.stderr for t in _ALREADY_OFF):
            # squeue shows a just-requeued job as COMPLETING (PENDING+COMPLETING) while its node cleans
            # up; Slurm then answers "Job is pending execution": the requeue already happened.
            log.info("job %s: already requeued or ending (%s); requeue is a no-op", job_id, res.stderr.strip())
            return
        raise_for(res, job=job_id)
        log.info("job %s: requeued from %s", job_id, ",".join(job.nodes))
        if self._requeue_starts_now:
            self.start_now(job_id)

    def start_now(self, job_id: str) -> None:
        """Make a pending (e.g. requeued) job eligible at once instead of ~121 s later."""
        self._scontrol(["update", f"jobid={job_id}", "starttime=now"], job=job_id)

    def hold(self, job_id: str) -> None:
        self._scontrol(["hold", job_id], job=job_id)

    def release(self, job_id: str) -> None:
        self._scontrol(["release", job_id], job=job_id)

    def signal(self, job_id: str, signal: str) -> None:
        name = signal_name(signal)
        res = self._run(["scancel", f"--signal={name}", "--full", job_id], timeout=self._timeout)
        raise_for(res, job=job_id)

    def request_checkpoint(self, job_id: str) -> str:
        """Ask a running job to checkpoint now: ``scancel --signal=<sig> <target> J`` with the signal
        the job declared (else the site default). A job with neither is not signalled: returns ``""``."""
        job = self.job(job_id)
        if job.state != JobState.RUNNING:
            raise NotFound("running job", job_id)
        sig = job.checkpoint_signal or self._ckpt_signal
        if not sig:
            log.info("job %s: declared no checkpoint signal (gpufleet:signal=...): not signalled", job_id)
            return ""
        res = self._run(["scancel", f"--signal={sig}", *self._ckpt_target, job_id], timeout=self._timeout)
        raise_for(res, job=job_id)
        log.info("job %s: asked to checkpoint (SIG%s to %s)", job_id, sig, " ".join(self._ckpt_target) or "its steps")
        return sig

    def record_checkpoint(self, job_id: str, at: datetime) -> None:
        """Set the job's checkpoint token, keeping the rest of its comment
        (see :mod:`gpufleet.schedulers.slurm.checkpoint`)."""
        comment = dict(self.job(job_id).extra).get("comment", "")
        self._scontrol(["update", f"jobid={job_id}", f"comment={with_checkpoint(comment, at)}"], job=job_id)

    # ---- internals ----------------------------------------------------------------------------
    def _boot_time(self) -> str:
        """slurmctld's BOOT_TIME (``scontrol show config``): changes exactly when it restarts."""
        res = self._scontrol(["show", "config"])
        for line in res.stdout.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "BOOT_TIME":
                return value.strip()
        return ""

    def _reassert_lost_drains(self, nodes: Sequence[SlurmNode]) -> bool:
        """Re-drain nodes whose drain a slurmctld restart lost; returns whether it changed anything."""
        by_name = {n.name: n for n in nodes}
        lost = [name for name in self._issued if name in by_name and not by_name[name].drain_flag]
        for name in [n for n in lost if not self._issued[n][1]]:  # boot time unknown: cannot tell, respect it
            log.info("%s: gpufleet's drain is gone from slurm; boot time unknown, not re-draining", name)
            self._issued.pop(name)
            lost.remove(name)
        if not lost:
            return False
        try:
            boot = self._boot_time()
        except ExternalError as err:  # look again on the next pass
            log.warning("cannot read slurmctld's boot time to check lost drains of %s: %s", lost, err)
            return False
        changed = False
        for name in lost:
            reason, boot_then = self._issued.pop(name)
            if boot and boot_then and boot != boot_then:
                log.warning("%s: slurmctld restarted (boot %s -> %s) and lost gpufleet's drain; draining again: %s",
                            name, boot_then, boot, reason)
                self._scontrol(["update", f"nodename={name}", "state=drain", f"reason={reason}"], node=name)
                self._issued[name] = (reason, boot)
                changed = True
            else:
                log.info("%s: gpufleet's drain (%r) was cleared by someone in slurm; respecting it", name, reason)
        return changed

    def _scontrol(self, args: list[str], *, node: str | None = None, job: str | None = None) -> CommandResult:
        res = self._run(["scontrol", *args], timeout=self._timeout)
        raise_for(res, node=node, job=job)
        return res

    @staticmethod
    def _running_by_node(running: Sequence[tuple[str, tuple[str, ...]]]) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for job_id, nodes in running:
            for n in nodes:
                out.setdefault(n, []).append(job_id)
        return {k: tuple(v) for k, v in out.items()}

