"""The training example at a size that fills one GPU, its reported MFU checked against a same-run ceiling.

    PYTHONPATH=src python3 scripts/mfu_vs_ceiling.py --out mfu.json

In one run, on one GPU (or the CPU, with a small ``--config``, to try the script):

1. the ``torch.matmul`` ceiling: the square bf16 product the checks bench uses (``checks.ops.gemm_tflops``,
   16384³) and the model's own largest product (its MLP's up projection, tokens x d x 4d), before training;
2. ``examples/tiny_gpt/train.py`` in bf16 with the peak from ``goodput/data/peak_flops.csv`` for this GPU,
   trying each ``--config`` in turn until one fits (an out-of-memory exits non-zero: the next, smaller, runs);
   ``nvidia-smi`` sampled every 0.5 s meanwhile (memory used, utilisation, power, SM clock);
3. ``gpufleet goodput report --json`` on the run: MFU in steps and per interval;
4. the square ceiling again, after training (a GPU that throttled shows it here).

The check: the model FLOP/s the report implies (MFU x peak) must not exceed the same run's ceiling: a
higher number is a timing bug (docs/goodput.md §MFU: an unsynchronised step read 86 % of the datasheet
peak). The JSON holds every number; docs/benchmarks.md §training example records them with date and device.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gpufleet.checks import ops
from gpufleet.goodput.flops import peak_flops, transformer_flops_per_step

ROOT = Path(__file__).resolve().parent.parent
SMI_FIELDS = "memory.used,memory.total,utilization.gpu,power.draw,clocks.sm,temperature.gpu"
# the size that fills an H100 80GB: 0.87 B parameters (AdamW state ~14 GB), 24,576 tokens per step;
# the second halves the batch if the first runs out of memory
CONFIGS = (
    "--batch 12 --seq 2048 --d-model 2048 --layers 16 --heads 16 --vocab 32000",
    "--batch 6 --seq 2048 --d-model 2048 --layers 16 --heads 16 --vocab 32000",
)


def sku_of(name: str) -> str:
    """The peak table's row for a CUDA device name ("NVIDIA H100 80GB HBM3" -> "H100 SXM")."""
    n = name.upper()
    for key, sku in (("H200", "H200 SXM"), ("H100 PCIE", "H100 PCIe"), ("H100", "H100 SXM"),
                     ("A100", "A100 SXM")):
        if key in n:
            return sku
    raise SystemExit(f"no peak FLOP/s row for device {name!r}: pass --peak-flops")


def shape_tflops(device: str, m: int, k: int, n: int, iters: int = 20, warmup: int = 5) -> float:
    """bf16 ``(m x k) @ (k x n)`` throughput, TFLOP/s (``checks.ops.timed``: median of three trials)."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    out = torch.empty(m, n, device=device, dtype=dtype)
    sec = ops.timed(lambda: torch.matmul(a, b, out=out), device, iters, warmup)
    return 2.0 * m * k * n / sec / 1e12


def square_tflops(device: str, n: int) -> float:
    dtype = "bf16" if device.startswith("cuda") else "fp32"
    value = ops.gemm_tflops(device, dtype, n, 20, 5)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return value


def opts(config: str) -> dict[str, int]:
    words = config.split()
    return {words[i].lstrip("-").replace("-", "_"): int(words[i + 1]) for i in range(0, len(words), 2)}


def smi_samples(path: Path) -> dict[str, float]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append([float(x) for x in line.split(",")])
        except ValueError:
            continue  # "[N/A]" or a header
    if not rows:
        return {}
    busy = [r for r in rows if r[2] > 0] or rows
    return {"samples": len(rows), "memory_used_max_mib": max(r[0] for r in rows), "memory_total_mib": rows[0][1],
            "util_busy_mean_pct": sum(r[2] for r in busy) / len(busy), "power_max_w": max(r[3] for r in rows),
            "sm_clock_busy_mean_mhz": sum(r[4] for r in busy) / len(busy), "temp_max_c": max(r[5] for r in rows)}


def train(config: str, peak: float, run_root: Path, steps: int, ckpt_every: int, extra: str) -> dict[str, Any]:
    run = Path(tempfile.mkdtemp(prefix="mfu-", dir=run_root))
    smi_log = run.with_suffix(".smi.csv")
    smi = None
    if shutil.which("nvidia-smi"):
        with smi_log.open("w") as f:
            smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                                    "-lms", "500"], stdout=f, stderr=subprocess.DEVNULL)
    cmd = [sys.executable, str(ROOT / "examples/tiny_gpt/train.py"), "--run-dir", str(run), "--dtype", "bf16",
           "--steps", str(steps), "--ckpt-every", str(ckpt_every), "--peak-flops", repr(peak),
           *config.split(), *extra.split()]
    t0 = time.time()
    rc = subprocess.run(cmd, check=False).returncode
    wall = time.time() - t0
    if smi is not None:
        smi.terminate()
        smi.wait()
    out: dict[str, Any] = {"config": f"{config} {extra}".strip(), "rc": rc, "wall_s": round(wall, 1)}
    if smi is not None:
        out["nvidia_smi"] = smi_samples(smi_log)
    if rc == 0:
        rep = subprocess.run([sys.executable, "-m", "gpufleet.cli", "goodput", "report", str(run), "--json"],
                             check=True, capture_output=True, text=True)
        out["report"] = json.loads(rep.stdout)
    shutil.rmtree(run, ignore_errors=True)  # the checkpoints are ~10 GB each
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="write the results here (JSON)")
    p.add_argument("--config", action="append", help="train.py size options; repeat for fallbacks")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=30)
    p.add_argument("--peak-flops", type=float, default=None, help="default: the table's dense bf16 peak")
    p.add_argument("--train-args", default="", help="more train.py options, e.g. '--mode sync'")
    p.add_argument("--square", type=int, default=16384, help="size of the square ceiling product")
    p.add_argument("--run-root", type=Path, default=None, help="where checkpoints go (default: /dev/shm if "
                   "it has 40 GB free, else the temp dir)")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda:0" if cuda else "cpu"
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = a.peak_flops if a.peak_flops is not None else peak_flops(sku_of(name), "bf16").flops
    run_root = a.run_root or (Path("/dev/shm") if Path("/dev/shm").exists()
                              and shutil.disk_usage("/dev/shm").free > 40e9 else Path(tempfile.gettempdir()))
    doc: dict[str, Any] = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
                           "date": time.strftime("%Y-%m-%d", time.gmtime()), "peak_flops": peak,
                           "run_root": str(run_root), "runs": []}
    doc["ceiling_square_before_tflops"] = square_tflops(device, a.square)
    for config in a.config or CONFIGS:
        o = opts(config)
        tokens = o["batch"] * o["seq"]
        doc["ceiling_mlp_shape_tflops"] = shape_tflops(device, tokens, o["d_model"], 4 * o["d_model"])
        if cuda:
            torch.cuda.empty_cache()
        r = train(config, peak, run_root, a.steps, a.ckpt_every, a.train_args)
        r["flops_per_step"] = transformer_flops_per_step(batch=o["batch"], seq=o["seq"], d_model=o["d_model"],
                                                         layers=o["layers"], vocab=o["vocab"])
        doc["runs"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "report"}), flush=True)
        if r["rc"] == 0:
            break
    doc["ceiling_square_after_tflops"] = square_tflops(device, a.square)
    done = doc["runs"][-1]
    if "report" in done:
        m = done["report"]["mfu"]
        ceiling = max(doc["ceiling_square_before_tflops"], doc["ceiling_square_after_tflops"],
                      doc["ceiling_mlp_shape_tflops"])
        achieved = m["training"] * peak / 1e12
        steady = [iv["mfu"] for iv in done["report"]["intervals"][1:] if iv.get("mfu")]
        doc["result"] = {
            "mfu_in_steps": m["training"], "mfu_end_to_end": m["effective"],
            "mfu_per_interval": [iv.get("mfu") for iv in done["report"]["intervals"]],
            "checkpoint_stall_s_per_interval": [round(iv["badput_s"].get("checkpoint_save", 0.0), 2)
                                                for iv in done["report"]["intervals"]],
            "checkpoints_durable": done["report"]["checkpoints_durable"],
            "achieved_tflops": achieved,
            "achieved_steady_tflops": max(steady) * peak / 1e12 if steady else None,
            "ceiling_tflops": ceiling, "of_ceiling": achieved / ceiling,
            "ceiling_of_peak": ceiling / (peak / 1e12),
            "check": "pass: below the same run's matmul ceiling" if achieved <= ceiling * 1.02
                     else "FAIL: above the same run's matmul ceiling (a timing bug)",
        }
    a.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc.get("result", {"error": "no configuration ran"}), indent=2))
    if "result" not in doc or doc["result"]["check"].startswith("FAIL"):
        raise SystemExit(1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
