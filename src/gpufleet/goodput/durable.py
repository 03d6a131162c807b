"""The durable recorder a training process holds: appends ``gpufleet.goodput/v1`` lines to its rank's file.

::

    rec = RunRecorder("runs/exp1")                 # rank, world, Slurm ids read from the environment
    for step in range(start, steps):
        with rec.step(step, tokens=batch_tokens):
            with rec.compute():                    # optional: the rank's own compute time (stragglers)
                loss = model(x).backward()
            allreduce(); optimizer.step()
    rec.end()

Durability: every record is one ``write(2)`` on a file opened with ``O_APPEND``, so a killed process
leaves whole lines (the page cache survives a process crash); ``fsync`` runs at the attempt header,
a checkpoint's completion, restore, failure and end (``fsync="checkpoint"``, the default; a checkpoint
completes on its upload thread, so the loop does not wait for that ``fsync``), after every record
(``"always"``) or never. A node crash can lose the lines after the last ``fsync`` and tear the last
one; the reader tolerates that (:mod:`gpufleet.goodput.runlog`). The recorder is thread-safe (an async
checkpoint's completion is recorded from its own thread) and never touches the controller.

A run directory holds one run: an attempt opened on a rank file whose last record is ``end`` (the run
finished) is refused, since appending would make the next experiment a restart of the finished one, its
gap badput (``append_after_end=True`` continues the finished run, e.g. training extended by more steps).
A crashed or killed attempt leaves no ``end``, so its relaunch resumes as before.

Times: the attempt's ``launched`` time is, in order, the ``launched`` argument, ``$GPUFLEET_LAUNCH_TIME``
(Unix seconds; set it before ``torchrun``/``srun`` to count launcher start-up) or the process's start
time from ``/proc``; record times are the wall clock read once, advanced by ``time.monotonic``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Literal

from gpufleet.domain.durations import positive_seconds
from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.goodput.runlog import FORMAT, RankLog, parse_rank_log

FsyncPolicy = Literal["always", "checkpoint", "never"]
# fsync'd under the default policy; never a record that the training loop waits on (ckpt_start/_end):
# an fsync there would be training time the log calls productive
_SYNCED = frozenset({"attempt", "ckpt_persisted", "restore_end", "failure", "end"})


def rank_file(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"goodput-rank{rank}.jsonl"


class RunRecorder:
    def __init__(self, run_dir: str | Path, *, rank: int | None = None, world: int | None = None,
                 launched: float | None = None, fsync: FsyncPolicy = "checkpoint", push: bool | None = None,
                 host: str | None = None, append_after_end: bool = False,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if fsync not in ("always", "checkpoint", "never"):
            raise InvalidInput("fsync", fsync, "always, checkpoint or never")
        self.rank = _env_int("RANK", "SLURM_PROCID") if rank is None else rank
        self.world = _env_int("WORLD_SIZE", "SLURM_NTASKS", default=1) if world is None else world
        if self.rank < 0 or self.world < 1 or self.rank >= self.world:
            raise InvalidInput("rank", self.rank, f"0 <= rank < world ({self.world})")
        self._fsync = fsync
        starts_pusher = self.rank == 0 and bool(push or (push is None and os.environ.get("GPUFLEET_CONTROLLER")))
        push_period = _push_period() if starts_pusher else ""  # checked before anything is written
        self._mono = monotonic
        self._anchor = (wall(), monotonic())
        self._lock = threading.Lock()
        self._step_t0: float | None = None
        self._compute = 0.0
        self._ended = False
        self.path = rank_file(run_dir, self.rank)
        if not append_after_end and _ended(self.path):
            raise InvalidInput("run_dir", str(run_dir),
                               f"a directory without a finished run ({self.path.name} ends with the run's end record): "
                               "a new directory per run, or append_after_end=True to continue the finished run")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size and not _ends_with_newline(self.path):
            os.write(self._fd, b"\n")  # a crash tore the last line: start ours on a fresh one
        launch = launched if launched is not None else _launch_time(self._anchor[0])
        header: dict[str, object] = {"ev": "attempt", "format": FORMAT, "launched": round(launch, 6),
                                     "rank": self.rank, "world": self.world, "pid": os.getpid(),
                                     "host": host or os.environ.get("SLURMD_NODENAME") or socket.gethostname()}
        for key, env in (("job", "SLURM_JOB_ID"), ("slurm_step", "SLURM_STEP_ID")):
            if os.environ.get(env):
                header[key] = os.environ[env]
        if os.environ.get("LOCAL_RANK", "").isdigit():
            header["local_rank"] = int(os.environ["LOCAL_RANK"])
        self._write(header)
        self._pusher: subprocess.Popen[bytes] | None = None
        if starts_pusher:
            self._pusher = _start_pusher(self.path.parent, push_period)

    # ---- the clock ----------------------------------------------------------------------------
    def now(self) -> float:
        """Unix seconds on this attempt's clock (wall clock at open + monotonic since)."""
        return self._anchor[0] + (self._mono() - self._anchor[1])

    # ---- records ------------------------------------------------------------------------------
    def model(self, flops_per_step: float, *, peak_flops: float | None = None, dtype: str = "") -> None:
        """Declare the model FLOPs one step does on this rank and the device's peak FLOP/s (for MFU)."""
        doc: dict[str, object] = {"ev": "model", "flops_per_step": float(flops_per_step)}
        if peak_flops is not None:
            doc["peak_flops"] = float(peak_flops)
        if dtype:
            doc["dtype"] = dtype
        self._write(doc)

    @contextmanager
    def step(self, step: int, *, tokens: int | None = None) -> Iterator[None]:
        """Time one training step; the line is written when it completes (a step that raises is not)."""
        t0 = self._mono()
        self._step_t0, self._compute = t0, 0.0
        yield
        self.step_done(step, self._mono() - t0, tokens=tokens, compute=self._compute or None)
        self._step_t0 = None

    def step_done(self, step: int, duration: float, *, tokens: int | None = None,
                  compute: float | None = None) -> None:
        """Record a step the loop timed itself (``duration`` seconds, ending now)."""
        doc: dict[str, object] = {"ev": "step", "step": step, "dur": round(duration, 6)}
        if tokens is not None:
            doc["tokens"] = tokens
        if compute is not None:
            doc["compute"] = round(compute, 6)
        self._write(doc)

    @contextmanager
    def compute(self) -> Iterator[None]:
        """Inside a step: the part this rank does alone (forward + backward, before the collective)."""
        t0 = self._mono()
        yield
        self._compute += self._mono() - t0

    @contextmanager
    def data_wait(self) -> Iterator[None]:
        """The loop waits for its input pipeline (badput ``data_wait``)."""
        t0 = self._mono()
        yield
        self.data_waited(self._mono() - t0)

    def data_waited(self, seconds: float) -> None:
        """Record ``seconds`` the loop waited for its input, ending now (a framework's callback hook)."""
        self._write({"ev": "data", "dur": round(max(0.0, seconds), 6)})

    def checkpoint_start(self, ckpt: int, step: int, *, is_async: bool) -> None:
        self._write({"ev": "ckpt_start", "ckpt": ckpt, "step": step, "async": is_async})

    def checkpoint_end(self, ckpt: int) -> None:
        self._write({"ev": "ckpt_end", "ckpt": ckpt})

    def checkpoint_persisted(self, ckpt: int, step: int) -> None:
        self._write({"ev": "ckpt_persisted", "ckpt": ckpt, "step": step})

    def restore_start(self) -> None:
        self._write({"ev": "restore_start"})

    def restore_end(self, step: int) -> None:
        self._write({"ev": "restore_end", "step": step})

    def failure(self, cause: str) -> None:
        self._write({"ev": "failure", "cause": cause})
        self._ended = True

    def end(self) -> None:
        if not self._ended:
            self._write({"ev": "end"})
            self._ended = True

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        if self._pusher is not None and self._pusher.poll() is None:
            self._pusher.terminate()  # the pusher pushes once more and exits; nobody waits for it

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.end()
        elif not issubclass(kind, KeyboardInterrupt | SystemExit):
            self.failure(kind.__name__)
        self.close()

    def _write(self, doc: dict[str, object]) -> None:
        with self._lock:
            if self._fd < 0:
                raise InvalidInput("recorder", str(self.path), "an open recorder (close() was called)")
            if doc["ev"] != "attempt" and doc["ev"] != "model":
                doc = {"t": round(self.now(), 6), **doc}
            os.write(self._fd, (json.dumps(doc, separators=(",", ":")) + "\n").encode())
            if self._fsync == "always" or (self._fsync == "checkpoint" and doc["ev"] in _SYNCED):
                os.fsync(self._fd)


def _push_period() -> str:
    """``$GPUFLEET_GOODPUT_PUSH_PERIOD`` (default 60), checked here: the push process would otherwise
    die on a typo where nobody looks, or push in a tight loop on 0."""
    raw = os.environ.get("GPUFLEET_GOODPUT_PUSH_PERIOD", "") or "60"
    return str(positive_seconds(raw, "GPUFLEET_GOODPUT_PUSH_PERIOD"))


def _start_pusher(run_dir: Path, period: str = "60") -> subprocess.Popen[bytes]:
    """The controller push as its own process (:mod:`gpufleet.goodput.push`): its reads, parsing and HTTP
    never take the training process's CPU or GIL, and it outlives a crash of it for one last push."""
    return subprocess.Popen([sys.executable, "-m", "gpufleet.goodput.push", str(run_dir), "--follow",
                             "--parent", str(os.getpid()), "--period", period],
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _env_int(*names: str, default: int = 0) -> int:
    for name in names:
        raw = os.environ.get(name, "")
        if raw:
            if not raw.isdigit():
                raise InvalidInput(name, raw, "a non-negative integer")
            return int(raw)
    return default


def _ended(path: Path) -> bool:
    """Whether ``path``'s last whole record is the run's ``end`` (a clean finish; a torn or missing last
    line is a crash, which a relaunch resumes)."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 4096))
            tail = f.read()
    except FileNotFoundError:
        return False
    if not tail.endswith(b"\n"):
        return False
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        doc = json.loads(last)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("ev") == "end"


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _launch_time(wall_now: float) -> float:
    raw = os.environ.get("GPUFLEET_LAUNCH_TIME", "")
    if raw:
        try:
            return float(raw)
        except ValueError:
            raise InvalidInput("GPUFLEET_LAUNCH_TIME", raw, "Unix seconds (e.g. $(date +%s.%N))") from None
    try:  # process start: /proc/self/stat field 22 (clock ticks after boot) against /proc/uptime
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(stat[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return wall_now - max(0.0, uptime - started)
    except (OSError, ValueError, IndexError):
        return wall_now


def read_run(run_dir: str | Path) -> list[RankLog]:
    """Every rank's log in ``run_dir`` (``goodput-rank<R>.jsonl``), parsed."""
    root = Path(run_dir)
    if not root.is_dir():
        raise NotFound("run directory", str(root))
    files = sorted(root.glob("goodput-rank*.jsonl"))
    if not files:
        raise InvalidInput("RUN_DIR", str(root), "a directory holding goodput-rank<R>.jsonl files")
    return [parse_rank_log(f.read_text("utf-8"), str(f)) for f in files]
