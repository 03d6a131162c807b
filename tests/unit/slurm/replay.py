"""A command runner that replays outputs recorded on the lab cluster (tests/fixtures/slurm)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from gpufleet.schedulers.slurm.parse import RUNNING_STATES
from gpufleet.schedulers.slurm.runner import CommandResult

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


# what the adapter asks for the jobs holding nodes: their ids and nodes (squeue --json cannot filter)
RUNNING = ("squeue", "--noheader", f"--states={RUNNING_STATES}", "--format=%A|%N")


def recording(name: str) -> CommandResult:
    entry = json.loads((FIXTURES / "index.json").read_text())[name]
    stdout = (FIXTURES / entry["stdout"]).read_text() if entry["stdout"] else ""
    return CommandResult(tuple(entry["argv"]), entry["rc"], stdout, entry["stderr"])


def recorded_job_ids() -> dict[str, str]:
    ids: dict[str, str] = json.loads((FIXTURES / "jobs.json").read_text())
    return ids


class ReplayRunner:
    """Answers each argv with a recording; commands that change state succeed silently unless a
    recording is given for them. Every call is kept in ``calls``."""

    def __init__(self, answers: dict[tuple[str, ...], str | list[str]]) -> None:
        """``answers`` maps argv to a recording name, or to a list of names used in turn (the last sticks)."""
        self._answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        key = tuple(argv)
        self.calls.append(key)
        if key in self._answers:
            names = self._answers[key]
            name = names if isinstance(names, str) else (names.pop(0) if len(names) > 1 else names[0])
            rec = recording(name)
            return CommandResult(key, rec.returncode, rec.stdout, rec.stderr)
        if key[:2] == ("scontrol", "show"):
            return CommandResult(key, 1, f"Node {key[-1]} not found\n", "")
        return CommandResult(key, 0, "", "")

    @property
    def writes(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[:2] != ("scontrol", "show") and c[0] not in ("sinfo", "squeue")]

    def answer(self, argv: tuple[str, ...], names: str | list[str]) -> None:
        self._answers[argv] = names


def busy_cluster() -> ReplayRunner:
    """The "busy" recording: n1 allocated, n2 drained by gpufleet, n3 draining by an admin, ghost drained."""
    answers: dict[tuple[str, ...], str | list[str]] = {
        ("sinfo", "--json"): "sinfo-busy", ("squeue", "--json"): "squeue-busy", RUNNING: "running-busy",
        ("scontrol", "show", "config"): "show-config",
    }
    for n in ("n1", "n2", "n3", "ghost"):
        answers[("scontrol", "show", "node", n)] = f"show-node-{n}-busy"
    for name, job in recorded_job_ids().items():
        answers[("scontrol", "show", "job", job)] = f"show-job-{name}-busy"
    answers[("scontrol", "show", "job", "999999")] = "show-job-unknown"
    return ReplayRunner(answers)
