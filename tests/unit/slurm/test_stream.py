"""Reading a whole Slurm queue record by record (docs/scale.md#jobs-at-scale): the same jobs as parsing the
document at once, errors found wherever they are, and memory that follows what is kept, not the queue."""

from __future__ import annotations

import json
import sys
import tracemalloc
from collections.abc import Iterator, Sequence

import pytest

from gpufleet.domain.errors import ExternalError, NotFound
from gpufleet.schedulers.port import Job, JobState
from gpufleet.schedulers.slurm import SlurmScheduler, SubprocessRunner
from gpufleet.schedulers.slurm.parse import jobs_from_squeue, stream_jobs
from gpufleet.schedulers.slurm.runner import CommandResult
from tests.unit.slurm.replay import RUNNING, busy_cluster, recorded_job_ids, recording


def _chunks(text: str, size: int) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i:i + size]


@pytest.mark.parametrize("size", [1, 7, 100, 4096, 10**9])
def test_streamed_in_any_chunks_the_jobs_are_those_of_the_whole_document(size: int) -> None:
    text = recording("squeue-busy").stdout
    assert stream_jobs(_chunks(text, size)) == jobs_from_squeue(text)


def test_only_the_jobs_keep_accepts_are_kept() -> None:
    text = recording("squeue-busy").stdout
    every = jobs_from_squeue(text)
    seen: list[str] = []

    def keep(j: Job) -> bool:
        seen.append(j.id)
        return j.state == JobState.RUNNING

    kept = stream_jobs(_chunks(text, 64), keep)
    assert seen == [j.id for j in every]  # every record looked at once
    assert kept == [j for j in every if j.state == JobState.RUNNING] and kept


def test_an_unreachable_controller_in_the_document_is_retryable() -> None:
    with pytest.raises(ExternalError) as err:
        stream_jobs(_chunks(recording("squeue-unreachable").stdout, 5))
    assert err.value.retryable


@pytest.mark.parametrize(("doc", "says"), [
    ('{"meta": {}, "errors": [], "jobs": [{"job_id": 1', "not JSON"),  # cut inside a record
    ('{"meta": {}, "errors": [], "jobs": [{"job_id": 1}', "the end of the output"),  # cut after one
    ('{"meta": {}, "errors": []}', "no 'jobs' list"),
    ('{"jobs": [1]}', "not an object"),
    ('{"jobs": []} x', "more output after the document"),
    ('["jobs"]', "expected one of '{'"),
    ("", "the end of the output"),
])
def test_malformed_output_is_an_error_saying_what_is_wrong(doc: str, says: str) -> None:
    with pytest.raises(ExternalError) as err:
        stream_jobs(_chunks(doc, 3))
    assert says in str(err.value)
    assert not err.value.retryable


def test_errors_after_the_jobs_still_raise() -> None:
    doc = '{"jobs": [], "errors": [{"error": "Unspecified error", "errno": -1}]}'
    with pytest.raises(ExternalError, match="Unspecified error"):
        stream_jobs(_chunks(doc, 4))


def _queue_document(jobs: int) -> Iterator[str]:
    """A ``squeue --json`` document of ``jobs`` recorded-shaped job records, made as it is read (the
    document itself is never in memory: only what the reader keeps of it)."""
    record = json.loads(recording("squeue-busy").stdout)["jobs"][0]
    yield '{"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "jobs": ['
    for i in range(jobs):
        text = json.dumps({**record, "job_id": 100_000 + i, "job_state": "PENDING" if i else "RUNNING"})
        yield ("," if i else "") + text
    yield "]}"


def test_memory_follows_the_kept_jobs_not_the_queue() -> None:
    """2,000 jobs (~6 MB of JSON) read in 32 KB chunks: the reader never holds more than a few chunks."""
    size = sum(len(c) for c in _queue_document(2_000))
    tracemalloc.start()
    try:
        kept = stream_jobs(_rechunk(_queue_document(2_000), 1 << 15), lambda j: j.id == "101999")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [j.id for j in kept] == ["101999"]
    assert size > 4_000_000
    assert peak < size / 20, f"peak {peak} bytes while reading a {size}-character queue"


def _rechunk(parts: Iterator[str], size: int) -> Iterator[str]:
    buf = ""
    for p in parts:
        buf += p
        while len(buf) >= size:
            yield buf[:size]
            buf = buf[size:]
    if buf:
        yield buf


class StreamingReplay:
    """The busy recording, answering ``squeue --json`` through ``stream`` (as SubprocessRunner does)."""

    def __init__(self) -> None:
        self.replay = busy_cluster()
        self.streamed: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        assert tuple(argv) != ("squeue", "--json"), "the whole queue must be streamed, not read at once"
        return self.replay(argv, timeout=timeout)

    def stream(self, argv: Sequence[str], *, timeout: float) -> Iterator[str]:
        self.streamed.append(tuple(argv))
        yield from _chunks(self.replay(argv, timeout=timeout).stdout, 100)


def test_the_whole_queue_is_streamed_never_read_at_once() -> None:
    r = StreamingReplay()
    every = SlurmScheduler(r).list_jobs()
    assert r.streamed == [("squeue", "--json")]
    assert every == jobs_from_squeue(recording("squeue-busy").stdout)
    kept = SlurmScheduler(r).find_jobs(lambda j: j.state == JobState.PENDING)
    assert kept and all(j.state == JobState.PENDING for j in kept)


@pytest.mark.parametrize("name", sorted(recorded_job_ids()))
def test_a_job_read_alone_is_the_job_the_queue_shows(name: str) -> None:
    """``scontrol show job J`` (slurmctld loads J alone) and ``squeue --json``, recorded at the same moment,
    make the same Job: one place (parse.job_from_record) turns either into the port's terms."""
    job_id = recorded_job_ids()[name]
    r = StreamingReplay()
    job = SlurmScheduler(r).job(job_id)
    assert r.streamed == [] and ("scontrol", "show", "job", job_id) in r.replay.calls
    assert job == {j.id: j for j in jobs_from_squeue(recording("squeue-busy").stdout)}[job_id]


def test_a_job_slurm_does_not_know_is_not_found_and_a_bad_id_is_never_passed_on() -> None:
    r = StreamingReplay()
    with pytest.raises(NotFound):
        SlurmScheduler(r).job("999999")
    calls = len(r.replay.calls)
    for bad in ("abc", "-h", "12;3", ""):
        with pytest.raises(NotFound):
            SlurmScheduler(r).job(bad)
    assert len(r.replay.calls) == calls


def test_a_job_lookup_while_slurmctld_is_down_is_retryable() -> None:
    ids = recorded_job_ids()
    r = busy_cluster()
    r.answer(("scontrol", "show", "job", ids["train-a"]), "show-job-unreachable")
    with pytest.raises(ExternalError) as err:
        SlurmScheduler(r).job(ids["train-a"])
    assert err.value.retryable


@pytest.mark.parametrize("text", ["", "JobId=7 JobName=x\n   JobState=RUNNING\n", "garbage"])
def test_scontrol_output_without_the_job_is_an_error(text: str) -> None:
    from gpufleet.schedulers.slurm.parse import record_from_scontrol

    with pytest.raises(ExternalError, match="scontrol show job 1: unexpected output"):
        record_from_scontrol(text, "1")


def test_a_nodes_jobs_are_the_running_ones_read_by_id() -> None:
    ids = recorded_job_ids()
    r = StreamingReplay()
    jobs = SlurmScheduler(r).jobs_on("n1")
    assert {j.id for j in jobs} == {ids["train-a"], ids["train-b"]}
    assert RUNNING in r.replay.calls  # which jobs run there: the filtered text read; then each alone
    assert r.streamed == [] and {c for c in r.replay.calls if c[:3] == ("scontrol", "show", "job")} == {
        ("scontrol", "show", "job", ids["train-a"]), ("scontrol", "show", "job", ids["train-b"])}
    assert all(j.state == JobState.RUNNING and "n1" in j.nodes for j in jobs)


def test_subprocess_stream_hands_over_the_output_in_chunks_and_raises_for_a_failed_command() -> None:
    out = list(SubprocessRunner().stream(
        [sys.executable, "-c", "import sys; sys.stdout.write('x' * 3_000_000)"], timeout=30))
    assert "".join(out) == "x" * 3_000_000 and len(out) >= 3
    with pytest.raises(ExternalError, match="Unable to contact slurm controller") as err:
        list(SubprocessRunner().stream([sys.executable, "-c", "import sys; sys.stderr.write("
                                        "'squeue: error: Unable to contact slurm controller'); sys.exit(1)"],
                                       timeout=30))
    assert err.value.retryable


def test_subprocess_stream_kills_a_command_that_does_not_finish() -> None:
    with pytest.raises(ExternalError, match="did not answer within") as err:
        list(SubprocessRunner().stream([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3))
    assert err.value.retryable


def test_subprocess_stream_of_a_missing_binary_is_not_retryable() -> None:
    with pytest.raises(ExternalError, match="not found") as err:
        list(SubprocessRunner().stream(["gpufleet-no-such-binary-xyz"], timeout=5))
    assert not err.value.retryable
