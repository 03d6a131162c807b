"""``gpufleet sim --sweep``: policy variants x seeds on local processes or Ray, with confidence intervals."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer

from gpufleet.sim.config import SimConfig
from gpufleet.sim.trace import FaultTrace


def sweep_command(cfg: SimConfig, control: str, policy: Path | None, extra_policies: list[Path], replicas: int,
                  seed: int, trace: FaultTrace | None, workers: int | None, ray: str | None, as_json: bool, *,
                  price: float | None = None, mfu: float | None = None) -> None:
    from gpufleet.domain.errors import InvalidInput
    from gpufleet.goodput.tco import tco
    from gpufleet.sim.compare import variants
    from gpufleet.sim.sweep import ControlSpec, Variant, backend_for, run_sweep

    if mfu is not None and price is None:
        raise InvalidInput("--mfu", mfu, "--price-per-gpu-hour as well (MFU is used only for TCO)")
    if price is not None:
        tco(price, cfg.gpus, 3600.0, 1.0, mfu)  # refuse a bad price or MFU before minutes of simulating

    for p in extra_policies:
        if not p.is_file():
            raise InvalidInput("--sweep-policy", str(p), "an existing policy file (TOML)")
    base = ControlSpec(control, policy)
    sweep = [Variant(label, c, base) for label, c in variants(cfg)]
    sweep += [Variant(f"policy {p.name}", cfg, ControlSpec("lifecycle", p)) for p in extra_policies]
    backend = backend_for(workers, ray)
    total = len(sweep) * replicas
    started = time.perf_counter()
    last = [0.0]

    def progress(done: int) -> None:  # one line on stderr every few seconds on a terminal
        now = time.perf_counter()
        if sys.stderr.isatty() and not as_json and (now - last[0] > 2 or done == total):
            last[0] = now
            typer.echo(f"\rsweep: {done}/{total} replicas on {backend.name}", err=True, nl=done == total)

    summaries = run_sweep(sweep, replicas, seed, backend, trace=trace, progress=progress)
    elapsed = time.perf_counter() - started
    doc: dict[str, Any] = {
        "sweep": {"scenario": cfg.name, "gpus": cfg.gpus, "days": cfg.days, "replicas": replicas, "seed": seed,
                  "backend": backend.name, "tasks": total, "elapsed_s": elapsed},
        "variants": [{**s.to_json(), "control": v.control.kind,
                      "policy_file": str(v.control.policy) if v.control.policy else None}
                     for v, s in zip(sweep, summaries, strict=True)],
    }
    if price is not None:  # the campaign's cost at the mean ETTR of each variant
        for v, s in zip(doc["variants"], summaries, strict=True):
            v["tco"] = tco(price, cfg.gpus, cfg.horizon, s.ettr_mean(), mfu).as_dict()
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    _print(doc)


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    sw = doc["sweep"]
    t = Table(title=f"{sw['scenario']} — {sw['gpus']} GPUs, {sw['days']:g} days: {len(doc['variants'])} variants "
              f"x {sw['replicas']} seeds on {sw['backend']} in {sw['elapsed_s']:.1f} s")
    cols = ["variant", "ETTR mean", "95 % CI", "interruptions", "MTTF h"]
    priced = "tco" in doc["variants"][0]
    if priced:
        cols.append("per useful GPU-h" if doc["variants"][0]["tco"]["mfu"] is not None else "per productive GPU-h")
    for col in cols:
        t.add_column(col, justify="left" if col == "variant" else "right")
    base = doc["variants"][0]["ettr"]["mean"]
    for v in doc["variants"]:
        e = v["ettr"]
        lo, hi = e["ci95"]
        delta = "" if v is doc["variants"][0] else f" ({100 * (e['mean'] - base):+.2f} pt)"
        mttf = v["mttf_hours"]
        row = [v["label"], f"{e['mean']:.4f}{delta}", f"[{lo:.4f}, {hi:.4f}]",
               f"{v['interruptions']['total']:.1f}", f"{mttf:.1f}" if mttf is not None else "-"]
        if priced:
            c = v["tco"]
            per = c["per_useful_gpu_hour"] if c["mfu"] is not None else c["per_productive_gpu_hour"]
            row.append("-" if per is None else f"{per:.3f}")
        t.add_row(*row)
    Console().print(t)
