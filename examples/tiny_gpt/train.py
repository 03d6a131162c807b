"""Train a tiny GPT with gpufleet goodput: durable run log, async checkpoints, auto-resume, MFU, stragglers.

    GPUFLEET_LAUNCH_TIME=$(date +%s.%N) torchrun --nproc-per-node 2 examples/tiny_gpt/train.py --run-dir runs/t1
    gpufleet goodput report runs/t1

Kill it (or `scancel --signal=USR1` it for a checkpoint now) and run the same command again: it resumes
from the latest complete checkpoint and the report counts the restart. CPU (gloo) or GPU (nccl); on a CPU
the defaults (200 steps, d_model 64) take about 10 s, most of it importing torch. Needs gpufleet and torch
importable by torchrun's Python (e.g. the project's venv). MFU is reported only with `--peak-flops`.
Start each experiment in a new `--run-dir`: a relaunch into a finished run's directory appends to it.
A crash and a straggler on purpose (docs/goodput.md shows the report):

    A="--run-dir runs/t2 --steps 70 --ckpt-every 10 --slow-rank 1 --slow-from 25 --slow-factor 3"
    torchrun --nproc-per-node 2 examples/tiny_gpt/train.py $A --crash-at 34   # exits non-zero
    torchrun --nproc-per-node 2 examples/tiny_gpt/train.py $A                 # resumes from step 30
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist
from model import TinyGPT, loss_of

from gpufleet.goodput.durable import RunRecorder
from gpufleet.goodput.flops import transformer_flops_per_step
from gpufleet.goodput.torch_checkpoint import Checkpointer, ModelOptimState, complete_checkpoints


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--mode", choices=("async", "sync"), default="async")
    p.add_argument("--peak-flops", type=float, default=None, help="per-device peak FLOP/s, for MFU")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="compute precision: bf16 runs the step under autocast (tensor cores on a GPU)")
    p.add_argument("--slow-rank", type=int, default=-1, help="inject: this rank computes slower ...")
    p.add_argument("--slow-from", type=int, default=0, help="... from this step ...")
    p.add_argument("--slow-factor", type=float, default=1.0, help="... by this factor")
    p.add_argument("--crash-at", type=int, default=-1, help="inject: every rank dies (SIGKILL) inside this step")
    p.add_argument("--truth", action="store_true", help="rank 0 prints wall-clock ground truth lines")
    a = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world > 1:
        dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    torch.manual_seed(0)
    model = TinyGPT(a.vocab, a.d_model, a.layers, a.heads, a.seq).to(dev)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    params = list(model.parameters())

    run_dir = Path(a.run_dir)
    # a run that resumes from a checkpoint continues its log, even after the run's end (more --steps)
    rec = RunRecorder(run_dir, append_after_end=bool(complete_checkpoints(run_dir / "ckpt")))
    # the model FLOPs of one rank's step: the analytic formula (tests/unit/goodput checks it against
    # torch.utils.flop_counter on this model)
    rec.model(transformer_flops_per_step(batch=a.batch, seq=a.seq, d_model=a.d_model, layers=a.layers,
                                         vocab=a.vocab), peak_flops=a.peak_flops, dtype=a.dtype)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    ckpt = Checkpointer(run_dir / "ckpt", rec, every=a.ckpt_every, mode=a.mode)
    state = ModelOptimState(model, optim)
    start = ckpt.restore(state)

    for step in range(start, a.steps):
        t0 = time.time()
        g = torch.Generator().manual_seed(step * 1000 + rank)  # the batch is a function of (step, rank)
        batch = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(dev)
        with rec.step(step, tokens=a.batch * a.seq * world):
            with rec.compute():
                c0 = time.perf_counter()
                with amp:
                    loss = loss_of(model, batch)
                loss.backward()
                if step == a.crash_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # fault injection: the node died mid-step
                if rank == a.slow_rank and step >= a.slow_from and a.slow_factor > 1:
                    time.sleep((time.perf_counter() - c0) * (a.slow_factor - 1))  # fault injection
            if world > 1:  # data parallel by hand: one flattened all-reduce of the gradients
                flat = torch.cat([q.grad.reshape(-1) for q in params])
                dist.all_reduce(flat)
                flat /= world
                off = 0
                for q in params:
                    n = q.numel()
                    q.grad.copy_(flat[off:off + n].view_as(q))
                    off += n
            optim.step()
            optim.zero_grad(set_to_none=True)
            if cuda:  # the step ends when the GPU is done: without this the host's launch time is timed and
                torch.cuda.synchronize()  # MFU reads high (86 % of an H100's peak in one run, 2026-11-26)
        saved = ckpt.due(step)  # (ckpt.after_step(step, state) does both; split here to time the save alone)
        t1 = time.time()
        if saved:
            ckpt.save(step + 1, state)
        t2 = time.time()
        if a.truth and rank == 0:
            print(json.dumps({"truth": "step", "step": step, "begin": t0, "end": t2,
                              "stall": t2 - t1 if saved else 0.0, "loss": loss.item()}), flush=True)
    if a.truth and rank == 0:  # the last iteration's end (what follows is the final save, a stall)
        print(json.dumps({"truth": "loop_end", "time": time.time()}), flush=True)
    ckpt.finish(a.steps, state)
    rec.end()
    if a.truth and rank == 0:
        print(json.dumps({"truth": "end", "time": time.time()}), flush=True)
    rec.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
