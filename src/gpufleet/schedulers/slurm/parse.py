"""Parsers for Slurm 22.05's own outputs: ``sinfo --json``, ``squeue --json`` (openapi v0.0.38 schema,
the same one slurmrestd serves) and ``scontrol show node`` (text).

They turn Slurm's vocabulary into the port's (:class:`SchedNodeState`, :class:`JobState`) and keep the
Slurm-only facts (features, weight, who set the reason) in :class:`SlurmNode`. Malformed output is an
:class:`ExternalError`: Slurm said something we cannot read, which is Slurm's failure, not the user's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpufleet.domain.errors import ExternalError
from gpufleet.schedulers.port import Job, JobState, SchedNode, SchedNodeState
from gpufleet.schedulers.slurm.checkpoint import parse_checkpoint, parse_signal
from gpufleet.schedulers.slurm.hostlist import expand
from gpufleet.schedulers.slurm.runner import SYSTEM, unreachable

_BUSY_BASE = frozenset({"allocated", "mixed", "completing"})
_DRAIN_FLAGS = frozenset({"DRAIN", "FAIL"})

# Slurm job states (JOB_* names, as squeue --json prints them) -> the port's JobState.
_JOB_STATES: Mapping[str, JobState] = {
    "PENDING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "CONFIGURING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,  # still holds its nodes
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
    "DEADLINE": JobState.FAILED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "REQUEUED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "SPECIAL_EXIT": JobState.REQUEUED,
}
# squeue --states for the jobs that hold their nodes: every Slurm state read as RUNNING above (a COMPLETING
# job's epilog still runs there: a node is not free of it, e.g. for a maintenance action, until it ends)
RUNNING_STATES = ",".join(name for name, state in _JOB_STATES.items() if state is JobState.RUNNING)


# Scheduler.place_last on Slurm: the node's weight plus this (Slurm allocates the lowest weights first), taken
# off again to undo it, so the weights a site configured survive. Weights of a million and more read as
# "placed last by gpufleet"; a site's own weights must stay below it.
PLACE_LAST_WEIGHT = 1_000_000


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """One node as Slurm reports it (the port's view is :meth:`view`)."""

    name: str
    base_state: str  # lower case: idle, allocated, mixed, down, unknown, future, ...
    flags: tuple[str, ...]  # upper case: DRAIN, NOT_RESPONDING, COMPLETING, ...
    reason: str = ""
    reason_user: str = ""
    reason_time: datetime | None = None
    features: tuple[str, ...] = ()
    active_features: tuple[str, ...] = ()
    weight: int = 1
    partitions: tuple[str, ...] = ()

    @property
    def drain_flag(self) -> bool:
        return bool(_DRAIN_FLAGS.intersection(self.flags))

    @property
    def busy(self) -> bool:
        return self.base_state in _BUSY_BASE or "COMPLETING" in self.flags

    @property
    def state(self) -> SchedNodeState:
        if self.drain_flag:
            return SchedNodeState.DRAINING if self.busy else SchedNodeState.DRAINED
        if self.base_state == "down":
            return SchedNodeState.DOWN
        if self.busy:
            return SchedNodeState.ALLOCATED
        if self.base_state == "idle":
            return SchedNodeState.IDLE
        return SchedNodeState.UNKNOWN

    @property
    def slurm_state(self) -> str:
        """Slurm's own spelling, e.g. ``MIXED+DRAIN``."""
        return "+".join((self.base_state.upper(), *self.flags))

    @property
    def placed_last(self) -> bool:
        """gpufleet raised this node's weight to keep it last in placement (a suspect)."""
        return self.weight >= PLACE_LAST_WEIGHT

    def view(self, jobs: Sequence[str] = ()) -> SchedNode:
        reason = self.reason if (self.drain_flag or self.base_state == "down") else ""
        return SchedNode(name=self.name, state=self.state, reason=reason, jobs=tuple(jobs),
                         placed_last=self.placed_last)


def load_json(text: str, what: str) -> Mapping[str, object]:
    """Parse a ``--json`` document and raise when Slurm put errors in it (it exits 0 even then)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ExternalError(SYSTEM, f"{what}: not JSON ({err}): {text[:200]!r}", retryable=False) from err
    if not isinstance(doc, dict):
        raise ExternalError(SYSTEM, f"{what}: expected a JSON object, got {type(doc).__name__}", retryable=False)
    _raise_errors(doc.get("errors") or [], what)
    return doc


def _raise_errors(errors: object, what: str) -> None:
    if errors:
        # 22.05 reports an unreachable controller as {"error": "Unspecified error", "errno": -1} (sinfo)
        # or {"source": "slurm_load_jobs", "error_number": -1, ...} (squeue) with an empty list and
        # exit status 0: treat any error as "Slurm did not answer", retryable.
        detail = "; ".join(
            " ".join(str(e[k]) for k in ("source", "description", "error") if e.get(k))
            + f" (errno {e.get('errno', e.get('error_number', '?'))})"
            for e in (errors if isinstance(errors, list) else []) if isinstance(e, dict)
        )
        raise ExternalError(SYSTEM, f"{what} reported errors (controller unreachable?): {detail or errors!r}")


def _list(doc: Mapping[str, object], key: str, what: str) -> list[Mapping[str, object]]:
    items = doc.get(key)
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ExternalError(SYSTEM, f"{what}: no {key!r} list in the output", retryable=False)
    return items


def _csv(value: object) -> tuple[str, ...]:
    if not isinstance(value, str) or value in ("", "(null)"):
        return ()
    return tuple(v for v in value.split(",") if v)


def _epoch(value: object) -> datetime | None:
    if isinstance(value, int) and value > 0:
        return datetime.fromtimestamp(value, UTC)
    return None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def nodes_from_sinfo(text: str) -> list[SlurmNode]:
    """Nodes from ``sinfo --json`` (or slurmrestd ``GET /slurm/v0.0.38/nodes``)."""
    doc = load_json(text, "sinfo --json")
    out = []
    for n in _list(doc, "nodes", "sinfo --json"):
        flags = n.get("state_flags") or []
        out.append(SlurmNode(
            name=_str(n.get("name")),
            base_state=_str(n.get("state")).lower() or "unknown",
            flags=tuple(str(f).upper() for f in flags) if isinstance(flags, list) else (),
            reason=_str(n.get("reason")),
            reason_user=_str(n.get("reason_set_by_user")),
            reason_time=_epoch(n.get("reason_changed_at")),
            features=_csv(n.get("features")),
            active_features=_csv(n.get("active_features")),
            weight=int(w) if isinstance(w := n.get("weight"), int) else 1,
            partitions=tuple(str(p) for p in p_list) if isinstance(p_list := n.get("partitions"), list) else (),
        ))
    return out


def jobs_from_squeue(text: str) -> list[Job]:
    """Jobs from ``squeue --json`` (or slurmrestd ``GET /slurm/v0.0.38/jobs``), all in memory at once:
    for small documents (tests, one job). A whole queue goes through :func:`stream_jobs`."""
    doc = load_json(text, "squeue --json")
    return [job_from_record(j) for j in _list(doc, "jobs", "squeue --json")]


def job_from_record(j: Mapping[str, object]) -> Job:
    """One element of the ``jobs`` list of ``squeue --json`` / slurmrestd."""
    raw_state = _str(j.get("job_state")).upper()
    state = _JOB_STATES.get(raw_state, JobState.PENDING if raw_state.endswith("HOLD") else JobState.FAILED)
    started = state is not JobState.PENDING and state is not JobState.REQUEUED
    restarts = j.get("restart_cnt")
    comment = _str(j.get("comment"))
    extra = (
        ("slurm_state", raw_state),
        ("state_reason", _str(j.get("state_reason"))),
        ("partition", _str(j.get("partition"))),
        ("user", _str(j.get("user_name"))),
        ("comment", comment),
    )
    return Job(
        id=str(j.get("job_id")),
        name=_str(j.get("name")),
        state=state,
        nodes=expand(_str(j.get("nodes"))) if started else (),
        start_time=_epoch(j.get("start_time")) if started else None,
        last_checkpoint=parse_checkpoint(comment),
        restarts=restarts if isinstance(restarts, int) else 0,
        gpus=tres_gpus(_str(j.get("tres_alloc_str"))),
        checkpoint_signal=parse_signal(comment),
        extra=extra,
    )


_JOB_ID = re.compile(r"\d+(?:_\d+)?")  # a job's own id, or an array task as ARRAYID_TASK


def is_job_id(text: str) -> bool:
    return _JOB_ID.fullmatch(text) is not None


def record_from_scontrol(text: str, job_id: str) -> dict[str, object]:
    """One job from ``scontrol show job J`` (text; slurmctld loads that job alone) as the record
    :func:`job_from_record` reads (the ``squeue --json`` field names), so a job read either way is
    turned into a :class:`Job` in one place. Used to look up a few jobs by id in a long queue."""
    for block in re.split(r"\n\s*\n", text.strip()):  # an array or het job prints one block per part
        fields: dict[str, str] = {}
        for raw in block.splitlines():
            line = raw.strip()
            whole = next((k for k in ("Comment=", "AdminComment=", "Command=", "WorkDir=", "StdOut=", "StdErr=",
                                      "StdIn=") if line.startswith(k)), None)
            if whole:
                fields[whole[:-1]] = line[len(whole):]
                continue
            head, sep, name = line.partition(" JobName=")  # the name takes the rest of its line (spaces too)
            if sep:
                fields["JobName"] = name
                line = head
            for tok in line.split():
                key, eq, value = tok.partition("=")
                if eq:
                    fields.setdefault(key, value)
        if fields.get("JobId") == job_id or (
                "_" in job_id and f"{fields.get('ArrayJobId')}_{fields.get('ArrayTaskId')}" == job_id):
            return _scontrol_record(fields)
    if unreachable(text):
        raise ExternalError(SYSTEM, f"controller unreachable: {text.strip()}")
    raise ExternalError(SYSTEM, f"scontrol show job {job_id}: unexpected output {text[:200]!r}", retryable=False)


def _scontrol_record(f: Mapping[str, str]) -> dict[str, object]:
    state = f.get("JobState", "")
    start = f.get("StartTime", "")
    try:  # slurmctld local time = UTC here, as for nodes (node_from_scontrol)
        started_at = int(datetime.fromisoformat(start).replace(tzinfo=UTC).timestamp())
    except ValueError:  # Unknown, None
        started_at = 0
    restarts = f.get("Restarts", "")
    return {
        "job_id": int(f["JobId"]),
        "name": f.get("JobName", ""),
        "job_state": state,
        # Reason= is the state description when the job has one ("ReqNodeNotAvail,_UnavailableNodes:n3", spaces
        # made "_"): its first part is the reason squeue --json names; a free-text description stays as it is
        "state_reason": f.get("Reason", "").split(",", 1)[0],
        "partition": f.get("Partition", ""),
        "user_name": f.get("UserId", "").split("(")[0],
        "comment": f.get("Comment", "").rstrip(),
        "nodes": f.get("NodeList", ""),
        "start_time": started_at,
        "restart_cnt": int(restarts) if restarts.isdigit() else 0,
        # TRES= is what a started job holds (a pending job's request otherwise; squeue --json says "")
        "tres_alloc_str": f.get("TRES", "") if state not in ("PENDING", "") else "",
    }


_WS = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


class _Chunks:
    """A text buffer filled from an iterator of chunks, consumed from the front (so it never holds
    much more than one job record and one chunk)."""

    def __init__(self, chunks: Iterable[str], what: str) -> None:
        self._it, self.what = iter(chunks), what
        self.buf, self.pos, self.eof = "", 0, False

    def more(self) -> bool:
        """Read one more chunk; False at the end of the document."""
        if self.eof:
            return False
        chunk = next(self._it, None)
        while chunk == "":
            chunk = next(self._it, None)
        if chunk is None:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-blank character ("" at the end)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]  # always matches
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c or c not in chars:
            found = repr(self.buf[self.pos:self.pos + 60]) if c else "the end of the output"
            raise ExternalError(SYSTEM, f"{self.what}: expected one of {chars!r}, found {found}", retryable=False)
        self.pos += 1
        return c

    def value(self) -> object:
        """The next JSON value, reading more chunks until it is complete."""
        self.peek()
        while True:
            try:
                value, end = _decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if self.more():
                    continue
                raise ExternalError(SYSTEM, f"{self.what}: not JSON ({err})", retryable=False) from err
            if end == len(self.buf) and self.more():  # a number or literal may go on in the next chunk
                continue
            self.pos = end
            return value


def stream_jobs(chunks: Iterable[str], keep: Callable[[Job], bool] | None = None,
                what: str = "squeue --json") -> list[Job]:
    """The jobs of a ``squeue --json`` / slurmrestd ``/jobs`` document that ``keep`` accepts (all without
    it), read record by record from ``chunks``: the whole document (about 3 KB a job: ~300 MB for a
    100,000-job queue) is never in memory, and a record ``keep`` rejects is dropped at once. Errors
    in the document raise as :func:`load_json` does, wherever they come in it."""
    src = _Chunks(chunks, what)
    out: list[Job] = []
    errors: object = []
    seen_jobs = False
    src.expect("{")
    if src.peek() == "}":
        src.pos += 1
    else:
        while True:
            key = src.value()
            if not isinstance(key, str):
                raise ExternalError(SYSTEM, f"{what}: expected a key, got {key!r}", retryable=False)
            src.expect(":")
            if key == "jobs":
                seen_jobs = True
                src.expect("[")
                if src.peek() == "]":
                    src.pos += 1
                else:
                    while True:
                        record = src.value()
                        if not isinstance(record, dict):
                            raise ExternalError(SYSTEM, f"{what}: a job that is not an object: {record!r:.100}",
                                                retryable=False)
                        job = job_from_record(record)
                        if keep is None or keep(job):
                            out.append(job)
                        if src.expect(",]") == "]":
                            break
            elif key == "errors":
                errors = src.value()
            else:
                src.value()  # meta, warnings: not needed
            if src.expect(",}") == "}":
                break
    if src.peek():
        raise ExternalError(SYSTEM, f"{what}: more output after the document: {src.buf[src.pos:src.pos + 60]!r}",
                            retryable=False)
    _raise_errors(errors, what)
    if not seen_jobs:
        raise ExternalError(SYSTEM, f"{what}: no 'jobs' list in the output", retryable=False)
    return out


def running_from_squeue_text(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(job id, its nodes) from ``squeue --noheader --states=<RUNNING_STATES> --format=%A|%N``."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, sep, nodes = line.strip().partition("|")
        if not sep or not job_id.isdigit():
            raise ExternalError(SYSTEM, f"squeue printed {line!r}, expected '<job id>|<node list>'",
                                retryable=True)
        out.append((job_id, expand(nodes)))
    return out


def is_running(job: Job) -> bool:
    return job.state == JobState.RUNNING


_GPU_TRES = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")


def tres_gpus(tres: str) -> int:
    """GPUs in a TRES string (``cpu=64,node=8,billing=64,gres/gpu=64``): the untyped ``gres/gpu``
    count when present, else the sum of typed ones (``gres/gpu:h100=8``); 0 without GPUs."""
    plain = re.search(r"(?:^|,)gres/gpu=(\d+)", tres)
    if plain:
        return int(plain.group(1))
    return sum(int(n) for n in _GPU_TRES.findall(tres))


# ``scontrol show node`` prints one "Key=value Key=value" line per group; these keys take the rest
# of their line (their values contain spaces).
_WHOLE_LINE_KEYS = ("Reason=", "OS=", "Comment=", "Extra=")
_REASON_TAIL = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^@\]]*)@(?P<time>[0-9T:-]+)\]\s*$")


def node_from_scontrol(text: str, name: str) -> SlurmNode:
    """One node from ``scontrol show node NAME`` (the multi-line form)."""
    fields: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        whole = next((k for k in _WHOLE_LINE_KEYS if line.startswith(k)), None)
        if whole:
            fields[whole[:-1]] = line[len(whole):]
            continue
        for tok in line.split():
            key, sep, value = tok.partition("=")
            if sep:
                fields[key] = value
    if fields.get("NodeName") != name:
        if unreachable(text):
            raise ExternalError(SYSTEM, f"controller unreachable: {text.strip()}")
        raise ExternalError(SYSTEM, f"scontrol show node {name}: unexpected output {text[:200]!r}", retryable=False)
    base, *flags = fields.get("State", "UNKNOWN").rstrip("*~#%$@^-!").split("+")
    reason, user, when = fields.get("Reason", ""), "", None
    if m := _REASON_TAIL.match(reason):
        reason, user = m.group("text"), m.group("user")
        when = datetime.fromisoformat(m.group("time")).replace(tzinfo=UTC)  # slurmctld local time = UTC here
    if reason in ("(null)", "none"):
        reason = ""
    weight = fields.get("Weight", "1")
    return SlurmNode(
        name=name,
        base_state=base.lower(),
        flags=tuple(f.upper() for f in flags),
        reason=reason,
        reason_user=user,
        reason_time=when,
        features=_csv(fields.get("AvailableFeatures")),
        active_features=_csv(fields.get("ActiveFeatures")),
        weight=int(weight) if weight.isdigit() else 1,
        partitions=_csv(fields.get("Partitions")),
    )
