"""Run benchmarks: ``python -m bench [NAME ...] [--quick]``; results go to bench/results/NAME.json, a
``--quick`` (smoke) run's to NAME.quick.json, so that it never replaces the full-size results the docs cite."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run only when named: what they need or cost is more than a default run should assume.
BY_NAME_ONLY = {
    "compiled": "builds the mypyc wheel (a C compiler, Python's headers) and runs correlate_scale four times",
}


def result_path(out: Path, name: str, quick: bool) -> Path:
    """Where benchmark ``name``'s results go: ``NAME.json``, or ``NAME.quick.json`` for a ``--quick`` run."""
    return out / f"{name}.quick.json" if quick else out / f"{name}.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("names", nargs="*", help="benchmark names (bench_<name>.py); default: all but "
                    + ", ".join(BY_NAME_ONLY) + " (run only when named)")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run (results: NAME.quick.json)")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    available = sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    names = args.names or [n for n in available if n not in BY_NAME_ONLY]
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        mod = importlib.import_module(f"bench.bench_{name}")
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        result = mod.run(quick=args.quick)
        doc = {
            "benchmark": name,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": __import__("os").cpu_count()},
            "quick": args.quick,
            "wall_s": round(time.perf_counter() - t0, 2),
            "results": result,
        }
        result_path(args.out, name, args.quick).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(json.dumps(result, indent=2, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
