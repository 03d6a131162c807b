"""Asynchronous checkpoints and auto-resume for a PyTorch training loop (torch imported lazily).

::

    ckpt = Checkpointer("ckpt/", rec, every=50)           # rec: a RunRecorder
    state = ModelOptimState(model, optimizer)
    start = ckpt.restore(state)                           # 0, or the step after the latest complete one
    for step in range(start, steps):
        train_step(step)
        ckpt.after_step(step, state)                      # saves every 50 steps, or when asked (SIGUSR1)
    ckpt.finish(steps, state)                             # waits for the upload, saves the final state

Layout: ``<root>/step-<n>/`` holds the state after ``n`` steps, written with
``torch.distributed.checkpoint`` (DCP). A checkpoint is *complete* when its ``.metadata`` exists: DCP
writes it last, to a temporary name renamed into place, after every rank's data. ``<root>/latest``
names the newest complete one (rank 0 rewrites it atomically; usable as the marker file of
``gpufleet slurm checkpoint --marker``). Resume reads the directories, not ``latest``.

Modes: ``async`` (default) is ``dcp.async_save``: the state is copied to CPU memory while training
waits (recorded as checkpoint badput), then written by a background thread while training goes on; the
checkpoint is durable (``ckpt_persisted``) when its future completes. With a process group, saves use
their own gloo group so the background collectives never interleave with training's. ``sync`` is
``dcp.save``. Fallback when ``async_save`` is missing (torch < 2.3) or ``mode="sync"`` is asked: a
blocking ``dcp.save`` -- slower, never wrong.

Staging is DCP's default (fresh pageable host memory each save): on one H100 the example's 10.5 GB state
took 8-9 s to stage (2026-11-27, docs/benchmarks.md §training example). A pinned-memory stager kept
between saves (DCP's ``DefaultStager``) failed inside torch 2.11 on this state (``KeyError: <class
'type'>`` while copying), so it is not used.
"""

from __future__ import annotations

import logging
import os
import re
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.signals import CheckpointRequest, ControllerReporter

if TYPE_CHECKING:
    from gpufleet.goodput.durable import RunRecorder

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^step-(\d+)$")


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(steps done, directory)`` of every complete checkpoint under ``root``, oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    out = []
    for d in base.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / ".metadata").is_file():
            out.append((int(m.group(1)), d))
    return sorted(out)


class ModelOptimState:
    """A DCP ``Stateful`` for a model and its optimizer (``get_state_dict``/``set_state_dict`` handle
    DDP/FSDP wrappers and an optimizer that has not stepped yet)."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


class Checkpointer:
    def __init__(self, root: str | Path, recorder: RunRecorder, *, every: int,
                 mode: Literal["async", "sync"] = "async", request: CheckpointRequest | None = None,
                 reporter: ControllerReporter | None = None) -> None:
        if every < 1:
            raise InvalidInput("every", every, "a checkpoint interval of >= 1 steps")
        if mode not in ("async", "sync"):
            raise InvalidInput("mode", mode, "async or sync")
        import torch.distributed as dist
        from torch.distributed.checkpoint import state_dict_saver

        self.root = Path(root)
        self.rec = recorder
        self.every = every
        self._dist = dist.is_available() and dist.is_initialized()
        self.mode = mode if hasattr(state_dict_saver, "async_save") else "sync"
        # two gloo groups of our own: the upload thread's collectives must never interleave with the
        # main thread's (the per-step request vote, restore) nor with training's
        self._pg = dist.new_group(backend="gloo") if self._dist else None
        self._upload_pg = dist.new_group(backend="gloo") if self._dist else None
        self.request = request if request is not None else CheckpointRequest().install()
        self.reporter = reporter if reporter is not None else (ControllerReporter.from_env()
                                                               if recorder.rank == 0 else None)
        self._pending: Future[Any] | None = None
        self.saved: list[int] = []

    def restore(self, state: Any) -> int:
        """Load the latest complete checkpoint into ``state``; the step to continue from (0 when none)."""
        from torch.distributed.checkpoint.state_dict_loader import load

        found = complete_checkpoints(self.root)
        step = found[-1][0] if found else 0
        if self._dist:  # every rank resumes from rank 0's choice (a late rename must not split them)
            import torch.distributed as dist

            box = [step]
            dist.broadcast_object_list(box, src=0, group=self._pg)
            step = int(box[0])
        if step == 0:
            return 0
        self.rec.restore_start()
        load({"app": state}, checkpoint_id=str(self.root / f"step-{step:08d}"), process_group=self._pg)
        self.rec.restore_end(step)
        return step

    def after_step(self, step: int, state: Any) -> bool:
        """Call when step ``step`` (0-based) is done: saves when due or asked; True when it saved."""
        if not self.due(step):
            return False
        self.save(step + 1, state)
        return True

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after step ``step``: every ``every`` steps, or when any rank was
        asked (a signal). Every rank must call it after every step: with several ranks it agrees on the
        answer with one small all-reduce, a per-step cost that is part of training, not of checkpoints."""
        due = (step + 1) % self.every == 0
        asked = self.request.take()
        if self._dist:
            import torch
            import torch.distributed as dist

            flag = torch.tensor([1 if asked else 0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._pg)
            asked = bool(flag.item())
        return due or asked

    def save(self, done: int, state: Any, *, blocking: bool = False) -> None:
        """Checkpoint the state after ``done`` steps."""
        from torch.distributed.checkpoint import state_dict_saver as dcp

        path = self.root / f"step-{done:08d}"
        is_async = self.mode == "async" and not blocking
        self.rec.checkpoint_start(done, done, is_async=is_async)
        self.wait()  # one upload at a time: waiting for the previous one is part of this stall
        if is_async:
            res = dcp.async_save({"app": state}, checkpoint_id=str(path), process_group=self._upload_pg)
            fut: Future[Any] = res if isinstance(res, Future) else res.upload_completion
            self._pending = fut
            fut.add_done_callback(lambda f: self._persisted(f, done, path))
            self.rec.checkpoint_end(done)
        else:
            dcp.save({"app": state}, checkpoint_id=str(path), process_group=self._pg)
            self.rec.checkpoint_end(done)
            self._mark(done, path)
        self.saved.append(done)

    def wait(self) -> None:
        """Block until the pending asynchronous save is durable (re-raises its error)."""
        if self._pending is not None:
            fut, self._pending = self._pending, None
            fut.result()

    def finish(self, done: int, state: Any) -> None:
        """End of training: the final state durable before returning (a blocking save, or waiting for its
        upload -- recorded as a checkpoint stall either way)."""
        if done not in self.saved:
            self.save(done, state, blocking=True)
        elif self._pending is not None and not self._pending.done():
            # the stall of the same checkpoint, not a second one (recorded as a synchronous save, it
            # was counted twice as durable)
            self.rec.checkpoint_start(done, done, is_async=True)
            self.wait()
            self.rec.checkpoint_end(done)
        self.wait()  # an upload that already ended: its error, if any, is raised here

    def _persisted(self, fut: Future[Any], done: int, path: Path) -> None:
        if fut.exception() is not None:
            log.error("checkpoint %s failed: %s; the previous one stays the latest", path, fut.exception())
            return
        self.rec.checkpoint_persisted(done, done)
        self._mark(done, path)

    def _mark(self, done: int, path: Path) -> None:
        if self.rec.rank != 0:
            return
        tmp = self.root / f".latest.{os.getpid()}"
        tmp.write_text(f"{path.name}\n", "utf-8")
        os.replace(tmp, self.root / "latest")
        if self.reporter is not None:
            self.reporter.checkpointed(self.rec.now())
