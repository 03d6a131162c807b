"""The Slurm validator's reads and writes on recorded Slurm outputs: where a validation job stands, and
its cancellation (the pending deadline: docs/lifecycle.md#validation-without-an-operator)."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.schedulers.slurm import SlurmScheduler
from gpufleet.schedulers.slurm.runner import CommandResult
from gpufleet.schedulers.slurm.validation import SlurmValidator, ValidationJobs
from tests.unit.slurm.replay import ReplayRunner, recording

JOBS = ValidationJobs("gpufleet check --level {level} --node {node}", "gpufleet")


def _validator(r: ReplayRunner) -> SlurmValidator:
    return SlurmValidator(SlurmScheduler(runner=r), JOBS, runner=r)


def test_a_pending_job_is_not_running_and_says_slurms_reason() -> None:
    """The drill: a job pending on ReqNodeNotAvail (its node drained by an operator) was read as running."""
    r = ReplayRunner({("scontrol", "show", "job", "4"): "show-job-waits-busy"})
    run = _validator(r).status("4")
    reason = next(t for t in recording("show-job-waits-busy").stdout.split() if t.startswith("Reason="))
    assert run.ended is None
    assert run.pending and reason.startswith(f"Reason={run.pending}")  # Slurm's own words, its first part


def test_a_running_job_is_neither_pending_nor_ended() -> None:
    r = ReplayRunner({("scontrol", "show", "job", "1"): "show-job-train-a-busy"})
    run = _validator(r).status("1")
    assert (run.ended, run.pending) == (None, "")


def test_cancel_runs_scancel_and_a_job_gone_already_is_fine() -> None:
    r = ReplayRunner({})
    _validator(r).cancel("4")
    assert r.writes == [("scancel", "4")]

    def gone(argv: Sequence[str], *, timeout: float) -> CommandResult:
        return CommandResult(tuple(argv), 1, "", "scancel: error: Kill job error on job id 5: Invalid job id specified")
    SlurmValidator(SlurmScheduler(runner=gone), JOBS, runner=gone).cancel("5")  # no error: it left the queue


def test_a_requeued_job_started_once_and_is_not_cancelled_as_never_started() -> None:
    """A review's case: a burn-in job that ran for hours is requeued (slurmd restarted under it). Slurm shows
    it pending again, but it did start: the pending deadline, counted from its submission, must not cancel it
    as "never started". Only a job that is PENDING waits on the deadline."""
    from gpufleet.schedulers.port import Job, JobState

    class Scheduler:  # only what status() reads: the job as the adapter parses it
        def __init__(self, state: JobState) -> None:
            self.state = state

        def job(self, handle: str) -> Job:
            return Job(handle, "gpufleet-validate", self.state, ("n1",),
                       extra=(("state_reason", "BeginTime"), ("slurm_state", self.state.upper())))

    r = ReplayRunner({})
    for state, pending in ((JobState.REQUEUED, ""), (JobState.PENDING, "BeginTime")):
        run = SlurmValidator(Scheduler(state), JOBS, runner=r).status("7")  # type: ignore[arg-type]
        assert (run.ended, run.pending) == (None, pending), state


def test_a_job_that_ended_says_whether_a_cancel_ended_it() -> None:
    """What the never-started mark relies on (decision 0130): cancelled, or gone from the queue, against a
    job that ended any other way (preempted too: Slurm preempts a job that runs)."""
    from gpufleet.domain.errors import NotFound
    from gpufleet.schedulers.port import Job, JobState

    class Scheduler:
        def __init__(self, state: JobState | None, slurm: str = "") -> None:
            self.state, self.slurm = state, slurm

        def job(self, handle: str) -> Job:
            if self.state is None:
                raise NotFound("job", handle)
            return Job(handle, "gpufleet-validate", self.state, ("n1",), extra=(("slurm_state", self.slurm),))

    r = ReplayRunner({})
    for state, slurm, cancelled in ((JobState.CANCELLED, "CANCELLED", True), (None, "", True),
                                    (JobState.CANCELLED, "PREEMPTED", False), (JobState.FAILED, "FAILED", False),
                                    (JobState.COMPLETED, "COMPLETED", False)):
        run = SlurmValidator(Scheduler(state, slurm), JOBS, runner=r).status("7")  # type: ignore[arg-type]
        assert run.ended and run.cancelled is cancelled, (state, slurm, run)
