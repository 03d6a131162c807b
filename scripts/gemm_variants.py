"""GPU survey: how the GEMM check's kernel choices move its TFLOPS (matrix size, FP8 fast accumulation).

Usage (on a CUDA machine, package importable): python scripts/gemm_variants.py [ROUNDS] [--short]
Interleaves the variants over ROUNDS (default 3) so that clock and power drift hit each alike; each
variant runs about 1.5 s of sustained work, or with --short a burst of 20 calls (8192^2) / 6 (16384^2)
after 3 warm-up calls. Prints one JSON line per measurement. Results and their use: docs/benchmarks.md
section checks, decision 0111 (bench/results/gemm-variants-h100.json holds both series).
"""

import json
import sys
from collections.abc import Callable

import torch

from gpufleet.checks.ops import random_pair, timed

args = [a for a in sys.argv[1:] if a != "--short"]
SHORT = "--short" in sys.argv[1:]
ROUNDS = int(args[0]) if args else 3
dev = "cuda"
if not torch.cuda.is_available():
    sys.exit("gemm_variants: needs a CUDA GPU (torch.cuda.is_available() is False)")


def variant(dtype: str, n: int, fast: bool) -> Callable[[], object]:
    a, b = random_pair(dev, n, seed=1234)
    if dtype == "fp8":
        a = a.to(torch.float8_e4m3fn)
        b = b.to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=dev)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast)
    t = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a, b = a.to(t), b.to(t)
    out = torch.empty(n, n, device=dev, dtype=t)
    return lambda: torch.matmul(a, b, out=out)


specs = [
    ("fp8", 8192, False),
    ("fp8", 8192, True),
    ("fp8", 16384, False),
    ("fp8", 16384, True),
    ("bf16", 8192, False),
    ("bf16", 16384, False),
    ("fp16", 8192, False),
    ("fp16", 16384, False),
]
for r in range(ROUNDS):
    for dtype, n, fast in specs:
        fn = variant(dtype, n, fast)
        if SHORT:
            s = timed(fn, dev, 20 if n == 8192 else 6, 3)
        else:
            est = timed(fn, dev, 3, 3)
            iters = max(6, int(1.5 / est))  # about 1.5 s of work per variant, so clocks settle alike
            s = timed(fn, dev, iters, 0)
        print(
            json.dumps(
                {
                    "round": r,
                    "series": "short" if SHORT else "sustained",
                    "dtype": dtype,
                    "n": n,
                    "fast_accum": fast,
                    "tflops": round(2.0 * n**3 / s / 1e12, 1),
                }
            ),
            flush=True,
        )
        del fn
        torch.cuda.empty_cache()
