"""gpufleet goodput for a PyTorch Lightning ``Trainer``: one callback, no change to the training code.

::

    from gpufleet.goodput.lightning_callback import GoodputCallback

    trainer = L.Trainer(callbacks=[GoodputCallback("runs/exp1", flops_per_step=f, peak_flops=989.4e12)])
    trainer.fit(model, data)          # then: gpufleet goodput report runs/exp1

What it records through :class:`~gpufleet.goodput.durable.RunRecorder` (the same per-rank run log a
plain loop writes, so the report, the push to the controller and the straggler detector work alike):
the attempt (rank and world from the trainer), each optimizer step with its duration — from the start
of the batch to the end of the step, after a device synchronisation on CUDA (without it the host's
launch time is timed and MFU reads high: docs/goodput.md §MFU) — and its tokens when ``tokens_per_step``
is given, the gap between one step's end and the next batch's start as data wait (the input pipeline,
and Lightning's own per-batch work), every checkpoint Lightning saves
(a synchronous save at the step it holds, from the hook until the next batch starts: Lightning writes
the file after the hook returns), a restore when ``fit`` resumes from a checkpoint,
and the end of the run. An exception in ``fit`` is recorded as a failure before it propagates.

``tracker``: an experiment-tracker backend (:class:`~gpufleet.goodput.mlflow_export.MlflowExporter`,
:class:`~gpufleet.goodput.wandb_export.WandbExporter`): on global rank 0 a
:class:`~gpufleet.goodput.tracker_loop.TrackerLoop` feeds it the goodput series and, with
``$GPUFLEET_CONTROLLER`` set, the infrastructure events on the job's nodes, until the fit ends.

Lightning is an optional dependency (``pip install 'gpufleet[lightning]'``); importing this module without it
raises
an ``ImportError`` that says so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as err:  # pragma: no cover - exercised only without lightning
    from gpufleet.goodput.trackers import missing_extra

    raise missing_extra("Lightning", "lightning", err) from err

from gpufleet.goodput.durable import RunRecorder
from gpufleet.goodput.tracker_loop import TrackerLoop
from gpufleet.goodput.trackers import TrackerExporter


class GoodputCallback(pl.Callback):
    def __init__(self, run_dir: str | Path, *, flops_per_step: float | None = None,
                 peak_flops: float | None = None, dtype: str = "", tokens_per_step: int | None = None,
                 tracker: TrackerExporter | None = None, tracker_period_s: float = 60.0) -> None:
        super().__init__()
        self.tracker, self.tracker_period_s = tracker, tracker_period_s
        self._loop: TrackerLoop | None = None
        self.run_dir = Path(run_dir)
        self.flops_per_step, self.peak_flops, self.dtype = flops_per_step, peak_flops, dtype
        self.tokens_per_step = tokens_per_step
        self.recorder: RunRecorder | None = None
        self._batch_t0: float | None = None
        self._last_end: float | None = None
        self._ckpt = 0
        self._saving: tuple[int, int] | None = None  # (checkpoint, step) Lightning is writing now

    # ---- the run ------------------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # fit(ckpt_path=...) continues the run, even one whose log ended; a fit from scratch into a finished
        # run's directory is refused (RunRecorder): it would read back as a restart that redid every step
        self.recorder = RunRecorder(self.run_dir, rank=trainer.global_rank, world=trainer.world_size,
                                    append_after_end=trainer.ckpt_path is not None)
        if self.flops_per_step is not None:
            self.recorder.model(self.flops_per_step, peak_flops=self.peak_flops, dtype=self.dtype)
        if trainer.ckpt_path:  # fit(ckpt_path=...) resumed: the restore happened before this hook
            self.recorder.restore_start()
            self.recorder.restore_end(trainer.global_step)
        if self.tracker is not None and trainer.global_rank == 0:
            self._loop = TrackerLoop.from_env(self.run_dir, self.tracker, period_s=self.tracker_period_s).start()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        now = time.monotonic()
        if self._saving is not None:
            self._saved()  # the save ran from its hook until now; the input pipeline waited for nothing
        elif self._last_end is not None and self.recorder is not None:
            self.recorder.data_waited(now - self._last_end)
        self._batch_t0 = now

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.recorder is None or self._batch_t0 is None:
            return
        _sync(pl_module)
        end = time.monotonic()
        # global_step counts optimizer steps already taken: this batch's step is the one before it
        self.recorder.step_done(max(0, trainer.global_step - 1), end - self._batch_t0, tokens=self.tokens_per_step)
        self._batch_t0, self._last_end = None, end

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if self.recorder is None:
            return
        # Lightning calls this hook while it builds the checkpoint and writes the file after it returns:
        # the save ends when the next batch starts (or the fit ends), which covers the write.
        if self._saving is not None:
            self._saved()
        self._ckpt += 1
        self.recorder.checkpoint_start(self._ckpt, trainer.global_step, is_async=False)
        self._saving = (self._ckpt, trainer.global_step)

    def _saved(self) -> None:
        if self.recorder is not None and self._saving is not None:
            ckpt, step = self._saving
            self.recorder.checkpoint_end(ckpt)
            self.recorder.checkpoint_persisted(ckpt, step)
        self._saving = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.recorder is not None:
            self._saved()
            self.recorder.end()
            self.recorder.close()
            self.recorder = None
        self._close_tracker()

    def _close_tracker(self) -> None:
        if self._loop is not None:
            self._loop.close()  # a last round with the run's totals (bounded: the tracker may be down)
            self._loop = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.recorder is not None:
            self.recorder.failure(f"{type(exception).__name__}: {exception}")
            self.recorder.close()
            self.recorder = None
        self._close_tracker()


def _sync(module: pl.LightningModule) -> None:
    device = getattr(module, "device", None)
    if device is not None and getattr(device, "type", "") == "cuda":
        import torch

        torch.cuda.synchronize(device)
