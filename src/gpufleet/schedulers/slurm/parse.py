"""Parsers for Slurm 22.05's own outputs: ``sinfo --json``, ``squeue --json`` (openapi v0.0.38 schema,
the same one slurmrestd serves) and ``scontrol show node`` (text).

They turn Slurm's vocabulary into the port's (:class:`SchedNodeState`, :class:`JobState`) and keep the
Slurm-only facts (features, weight, who set the reason) in :class:`SlurmNode`. Malformed output is an
:class:`ExternalError`: Slurm said something we cannot read, which is Slurm's failure, not the user's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
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
    errors = doc.get("errors") or []
    if errors:
        # 22.05 reports an unreachable controller as {"error": "Unspecified error", "errno": -1} (sinfo)
        # or {"source": "slurm_load_jobs", "error_number": -1, ...} (squeue) with an empty list and
        # exit status 0: treat any error as "Slurm did not answer", retryable.
        detail = "; ".join(
            " ".join(str(e[k]) for k in ("source", "description", "error") if e.get(k))
            + f" (errno {e.get('errno', e.get('error_number', '?'))})"
            for e in errors if isinstance(e, dict)
        )
        raise ExternalError(SYSTEM, f"{what} reported errors (controller unreachable?): {detail or errors!r}")
    return doc


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
    """Jobs from ``squeue --json`` (or slurmrestd ``GET /slurm/v0.0.38/jobs``)."""
    doc = load_json(text, "squeue --json")
    out = []
    for j in _list(doc, "jobs", "squeue --json"):
        raw_state = _str(j.get("job_state")).upper()
        state = _JOB_STATES.get(raw_state, JobState.PENDING if raw_state.endswith("HOLD") else JobState.FAILED)
        started = state is not JobState.PENDING and state is not JobState.REQUEUED
        restarts = j.get("restart_cnt")
        extra = (
            ("slurm_state", raw_state),
            ("state_reason", _str(j.get("state_reason"))),
            ("partition", _str(j.get("partition"))),
            ("user", _str(j.get("user_name"))),
            ("comment", _str(j.get("comment"))),
        )
        out.append(Job(
            id=str(j.get("job_id")),
            name=_str(j.get("name")),
            state=state,
            nodes=expand(_str(j.get("nodes"))) if started else (),
            start_time=_epoch(j.get("start_time")) if started else None,
            last_checkpoint=parse_checkpoint(_str(j.get("comment"))),
            restarts=restarts if isinstance(restarts, int) else 0,
            gpus=tres_gpus(_str(j.get("tres_alloc_str"))),
            checkpoint_signal=parse_signal(_str(j.get("comment"))),
            extra=extra,
        ))
    return out


def running_from_squeue_text(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(job id, its nodes) from ``squeue --noheader --states=RUNNING --format=%A|%N``."""
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


def running_from_jobs(jobs: Sequence[Job]) -> list[tuple[str, tuple[str, ...]]]:
    """The same from full job records (the slurmrestd reader, whose job list cannot be filtered)."""
    return [(j.id, j.nodes) for j in jobs if j.state == JobState.RUNNING]


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
