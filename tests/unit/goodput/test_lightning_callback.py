"""GoodputCallback: a Lightning Trainer's run on the CPU becomes the same run log a plain loop writes —
steps, checkpoints, a resume from a checkpoint, MFU — read back by the report."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl  # a dev dependency: CI installs it
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from gpufleet.goodput.durable import read_run
from gpufleet.goodput.lightning_callback import GoodputCallback
from gpufleet.goodput.runreport import run_report


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _data() -> DataLoader[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)


def _trainer(tmp_path: Path, steps: int, run: Path) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[GoodputCallback(run, flops_per_step=2e6, peak_flops=1e12, tokens_per_step=16),
                                 ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5,
                                                 save_top_k=-1)])


def test_a_fit_and_its_resume_read_back_as_one_run_with_one_restart(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _trainer(tmp_path, 12, run).fit(Regression(), _data())
    first = run_report(read_run(run))
    assert first.steps_kept == 12 and first.restarts == ()
    assert first.mfu is not None and first.mfu.flops_per_step == 2e6
    assert first.tokens_kept == 12 * 16
    assert first.goodput.productive > 0
    records = [json.loads(line) for line in (run / "goodput-rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["ev"] == "ckpt_persisted"] == [5, 10]  # Lightning's saves
    # ...counted as durable checkpoints: each save runs from its hook until the next batch starts (the
    # file is written after the hook returns) and is not mistaken for the input pipeline's wait
    assert first.goodput.checkpoints == 2 and first.goodput.ignored_events == 0
    assert first.goodput.badput.checkpoint_save > 0
    assert len(first.intervals) == 3  # cut at each durable checkpoint
    saved = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    assert [p.name for p in saved] == ["epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt"]
    # a requeued job: Lightning restores step 10 and runs to 20
    _trainer(tmp_path, 20, run).fit(Regression(), _data(), ckpt_path=str(tmp_path / "ckpt" / "epoch=0-step=10.ckpt"))
    both = run_report(read_run(run))
    assert len(both.restarts) == 1
    assert both.restarts[0].resumed == 10
    assert both.steps_kept == 20 and both.steps_redone == 2  # steps 10 and 11 ran again after the restore


def test_an_exception_in_fit_is_recorded_as_a_failure(tmp_path: Path) -> None:
    class Broken(Regression):
        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            if self.global_step == 3:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().training_step(batch, batch_idx)

    run = tmp_path / "run"
    with pytest.raises(RuntimeError):
        _trainer(tmp_path, 12, run).fit(Broken(), _data())
    text = (run / "goodput-rank0.jsonl").read_text()
    failures = [json.loads(line) for line in text.splitlines() if '"failure"' in line]
    assert len(failures) == 1 and "illegal memory access" in failures[0]["cause"]
    assert run_report(read_run(run)).steps_kept == 3


def test_with_a_tracker_the_fit_logs_its_goodput_series_to_wandb_offline(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from gpufleet.goodput.wandb_export import WandbExporter
    from tests.unit.goodput.wandb_file import history, summary

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("GPUFLEET_CONTROLLER", raising=False)
    run = tmp_path / "run"
    tracker = WandbExporter(project="lightning", mode="offline", dir=str(tmp_path))
    trainer = _trainer(tmp_path, 12, run)
    (cb,) = [c for c in trainer.callbacks if isinstance(c, GoodputCallback)]
    cb.tracker = tracker
    trainer.fit(Regression(), _data())
    # run.finish() returns before wandb-core has written the .wandb file's last block (seen in CI: 0 of 3
    # rows read back); teardown waits for the service to close its streams, as process exit does
    import wandb

    wandb.teardown()
    report = run_report(read_run(run))
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    points = [h for h in history(log) if "goodput/ettr" in h]
    assert len(points) == len(report.intervals) == 3
    assert points[-1]["goodput/ettr"] == pytest.approx(report.goodput.ettr, abs=1e-9)
    assert summary(log)["goodput_total/steps_kept"] == 12


def test_a_fit_from_scratch_into_a_finished_runs_directory_is_refused(tmp_path: Path) -> None:
    """Without ``ckpt_path`` the model starts over: appended, it would read back as a restart of the
    finished run that redid every step."""
    from gpufleet.domain.errors import InvalidInput

    run = tmp_path / "run"
    _trainer(tmp_path, 6, run).fit(Regression(), _data())
    before = (run / "goodput-rank0.jsonl").read_text()
    with pytest.raises(InvalidInput) as err:
        _trainer(tmp_path, 6, run).fit(Regression(), _data())
    assert err.value.field == "run_dir"
    assert (run / "goodput-rank0.jsonl").read_text() == before
