"""The Checkpointer on a real (CPU) model: what it writes, what the run log then says, and its input checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpufleet.domain.errors import InvalidInput
from gpufleet.goodput.durable import RunRecorder, rank_file
from gpufleet.goodput.ettr import compute
from gpufleet.goodput.intervals import run_intervals
from gpufleet.goodput.runlog import job_run, parse_rank_log
from gpufleet.goodput.torch_checkpoint import Checkpointer, ModelOptimState, complete_checkpoints

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _train(run: Path, steps: int, every: int) -> tuple[Checkpointer, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).to(DEV)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rec = RunRecorder(run, rank=0, world=1, fsync="never")
    ckpt = Checkpointer(run / "ckpt", rec, every=every, mode="async")
    state = ModelOptimState(model, optim)
    for step in range(ckpt.restore(state), steps):
        with rec.step(step):
            model(torch.randn(4, 8, device=DEV)).square().sum().backward()
            optim.step()
            optim.zero_grad()
        ckpt.after_step(step, state)
    ckpt.finish(steps, state)
    rec.end()
    rec.close()
    return ckpt, model


def test_the_last_async_checkpoint_counts_once_when_finish_waits_for_it(tmp_path: Path) -> None:
    # steps 0-5, a checkpoint every 3: async saves after 3 and after 6, and finish() waits for the second.
    # Recorded as a new synchronous save, that wait made the report count 3 durable checkpoints.
    _train(tmp_path, steps=6, every=3)
    written = [n for n, _ in complete_checkpoints(tmp_path / "ckpt")]
    log = parse_rank_log(rank_file(tmp_path, 0).read_text())
    report = compute(job_run(log).timeline)
    assert written == [3, 6]
    assert report.checkpoints == len(written)
    assert report.ignored_events == 0
    # intervals are cut at the durable snapshots and the end: 3 steps, 3 steps, then none
    assert [iv.steps for iv in run_intervals(log)] == [3, 3, 0]


def test_restore_loads_the_last_complete_checkpoint_into_a_fresh_model(tmp_path: Path) -> None:
    _, trained = _train(tmp_path, steps=6, every=3)
    fresh = torch.nn.Linear(8, 8).to(DEV)
    assert not torch.equal(fresh.weight, trained.weight)
    rec = RunRecorder(tmp_path / "again", rank=0, world=1, fsync="never")
    ckpt = Checkpointer(tmp_path / "ckpt", rec, every=3)
    assert ckpt.restore(ModelOptimState(fresh, torch.optim.AdamW(fresh.parameters()))) == 6
    assert torch.equal(fresh.weight, trained.weight)
    rec.close()


@pytest.mark.parametrize("field,value", [("mode", "later"), ("every", 0)])
def test_bad_options_name_the_field(tmp_path: Path, field: str, value: object) -> None:
    rec = RunRecorder(tmp_path, rank=0, world=1, fsync="never")
    kwargs: dict[str, object] = {"every": 5, field: value}
    with pytest.raises(InvalidInput) as err:
        Checkpointer(tmp_path / "ckpt", rec, **kwargs)  # type: ignore[arg-type]
    assert field in str(err.value) and str(value) in str(err.value)
    rec.close()
