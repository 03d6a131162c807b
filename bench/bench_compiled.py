"""The compiled correlation engine against the pure-Python one (decision 0109).

Builds the compiled wheel (``scripts/compiled_wheel.py``, from a copy of ``src``) into a temporary
directory, then runs ``bench correlate_scale`` in subprocesses, alternately on this install (pure
Python) and with the wheel first on ``PYTHONPATH`` (compiled), twice each, so both see the same box.
Reports each run's events per CPU-second (with coherence and counts only, for each of
``correlate_scale``'s three fresh-engine passes and its ``long_lived`` one, the steady state a controller
runs in) and, per pass, the ratio compiled / python of the medians. At full
size (131,072 GPUs) this takes about 16 minutes; ``--quick`` (8,192 GPUs) about one.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PASSES = ("first_pass", "second_pass", "controller_collector", "long_lived")
KEYS = ("v2_coherence_events_per_cpu_s", "v1_counts_only_events_per_cpu_s")


def _scale(quick: bool, out: Path, site: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    paths = [str(site)] if site else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    cmd = [sys.executable, "-m", "bench", "correlate_scale", "--out", str(out), *(["--quick"] if quick else [])]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"bench correlate_scale failed ({'compiled' if site else 'python'}):\n{res.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads((out / "correlate_scale.json").read_text())["results"]
    want = "compiled" if site else "python"
    if doc.get("build") != want:
        raise RuntimeError(f"expected the {want} engine, the run reports {doc.get('build')!r}")
    return doc


def _rate(doc: dict[str, Any], phase: str, key: str) -> int:
    """Events per CPU-second of one engine kind in one pass of a ``correlate_scale`` result (its
    ``long_lived`` pass keeps them per engine kind)."""
    if phase == "long_lived":
        kind = "v2_coherence" if key.startswith("v2_") else "v1_counts_only"
        return int(doc[phase][kind]["events_per_cpu_s"])
    return int(doc[phase][key])


def run(quick: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-compiled-") as tmp:
        root = Path(tmp)
        res = subprocess.run([sys.executable, str(REPO / "scripts" / "compiled_wheel.py"), "--dist",
                              str(root / "dist"), "--site", str(root / "site")], capture_output=True, text=True,
                             check=False)
        if res.returncode != 0:
            raise RuntimeError(f"could not build the compiled wheel:\n{res.stderr[-3000:]}")
        runs: dict[str, list[dict[str, Any]]] = {"python": [], "compiled": []}
        for i in range(2):
            for build, site in (("python", None), ("compiled", root / "site")):
                print(f"  correlate_scale, {build}, run {i + 1} of 2", file=sys.stderr, flush=True)
                runs[build].append(_scale(quick, root / f"{build}-{i}", site))
    table = {build: {p: {k: [_rate(d, p, k) for d in docs] for k in KEYS} for p in PASSES}
             for build, docs in runs.items()}
    ratio = {p: {k: round(statistics.median(table["compiled"][p][k]) / statistics.median(table["python"][p][k]), 3)
                 for k in KEYS} for p in PASSES}
    first = runs["python"][0]
    return {"gpus": first["gpus"], "events": first["events"], **table, "compiled_over_python": ratio}
