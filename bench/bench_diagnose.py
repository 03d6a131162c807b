"""Kernel-log decoding throughput and memory: ``python -m bench diagnose [--quick]``.

A synthetic, mostly benign journal-style log (real benign kernel lines, one fault every ~5,000
lines) is written to /tmp at two sizes (quick: 5 MB and 20 MB; full: 100 MB and 1 GB). Each size is
decoded by ``gpufleet diagnose``'s reader in a fresh subprocess that reports lines/s and its peak
RSS, so memory can be compared across sizes. Throughput is reported per CPU second (the single core
the decoder runs on; the shared CI box's other load does not count) and per wall-clock second.
Side by side, in one run: the block scanner (``reader.decode_stream``) against feeding every line
to ``Decoder.feed`` (the per-line API the node agent uses), on the smaller file. The generated
files are deleted afterwards.

Old against new in one run: with ``BENCH_DIAGNOSE_BASELINE=REV`` (a git revision, e.g. ``main``) the
``src/`` of that revision is exported to /tmp and both trees decode the smaller file, alternating,
``BENCH_DIAGNOSE_ROUNDS`` times (default 3); the result keeps each tree's best round per mode and
the ratio new / old (``baseline``).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (weight, line): common node chatter, with NVIDIA/mlx5 driver lines (which pass the cheap test and
# are then rejected by the recognisers) at about 1 in 60 lines.
BENIGN = [
    (30, "kernel: [{t}] systemd[1]: Started Session {n} of user root."),
    (20, "kernel: [{t}] audit: type=1400 audit({t}:{n}): apparmor=\"STATUS\" operation=\"profile_load\""),
    (10, "kernel: [{t}] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"),
    (30, "slurmd[2211]: launch task StepId={n}.0 request from UID:1000 GID:1000 HOST:10.0.0.7 PORT:41232"),
    (10, "kernel: [{t}] EXT4-fs (md127p3): re-mounted 0f3cd65a-338b-4574-bba3-ecef214e1917 r/w."),
    (10, "kernel: [{t}] pcieport 0000:15:02.0: PME: Signaling with IRQ 27"),
    (10, "kernel: [{t}] usb 1-1: new high-speed USB device number {n} using xhci_hcd"),
    (10, "kernel: [{t}] workqueue: ib_cache_event_task [ib_core] hogged CPU for >10000us 4 times"),
    (10, "kernel: [{t}] nfs: server storage01 OK"),
    (10, "kernel: [{t}] TCP: request_sock_TCP: Possible SYN flooding on port 8000. Sending cookies."),
    (5, "kernel: [{t}] mce: CPU supports 7 MCE banks"),
    (1, "kernel: [{t}] nvidia-uvm: Loaded the UVM driver, major device number 502."),
    (1, "kernel: [{t}] mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE"),
    (1, "kernel: [{t}] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 2024"),
]
FAULTS = [
    "kernel: [{t}] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
    "kernel: [{t}] NVRM: Xid (PCI:0000:5d:00): 94, pid=1234, name=python3, Contained ECC error",
    "kernel: [{t}] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout",
    "kernel: [{t}] pcieport 0000:00:03.0: AER: Corrected error received: 0000:3b:00.0",
    "kernel: [{t}] mlx5_core 0000:12:00.0: Port module event: module 0, Cable unplugged",
]
FAULT_EVERY = 5_000


def _template(lines: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        t = f"{100000 + i * 0.01:.6f}"
        if i % FAULT_EVERY == FAULT_EVERY - 1:
            line = rng.choice(FAULTS)
        else:
            line = rng.choices([b for _, b in BENIGN], weights=[w for w, _ in BENIGN])[0]
        out.append("Nov 21 12:00:00 gpu-node-17 " + line.format(t=t, n=rng.randrange(10**6)))
    return ("\n".join(out) + "\n").encode()


def _write(path: Path, size: int) -> None:
    block = _template(40_000)
    with path.open("wb") as f:
        written = 0
        while written < size:
            f.write(block)
            written += len(block)


_CHILD = r"""
import json, resource, sys, time
from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.reader import decode_stream, open_log
from gpufleet.diagnose.report import analyse
from gpufleet.domain.catalog import load_default_catalog
mode, path = sys.argv[1], sys.argv[2]
cat = load_default_catalog()
dec = Decoder(cat, year=2026)
t0, c0 = time.perf_counter(), time.process_time()
if mode == "block":
    with open_log(path) as fh:
        rep = analyse(decode_stream(fh, dec), cat, dec.stats)
    found = len(rep.findings) + rep.suppressed
else:
    found = 0
    with open(path, "rb") as fh:
        for line in fh:
            found += len(dec.feed(line))
    found += len(dec.flush())
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"mode": mode, "lines": dec.stats.lines, "candidates": dec.stats.candidates,
                  "findings": found, "wall_s": round(dt, 3), "cpu_s": round(cpu, 3),
                  "lines_per_wall_s": round(dec.stats.lines / dt),
                  "lines_per_cpu_s": round(dec.stats.lines / cpu),
                  "mb_per_cpu_s": round(dec.stats.bytes / cpu / 1e6, 1),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


REPO = Path(__file__).resolve().parents[1]


def _measure(mode: str, path: Path, src: Path = REPO / "src") -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(path)], capture_output=True, text=True,
                         check=True, env=env)
    return dict(json.loads(out.stdout))


def heldout() -> dict[str, object]:
    """Fault lines decoded right (line, kind, code, device and severity as the manifest expects) and
    benign lines reported, on the fixtures marked ``heldout`` in tests/fixtures/kernel-logs/manifest.toml:
    real lines nobody on the project wrote, gathered after the recognisers were written."""
    import tomllib

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from gpufleet.diagnose.decoder import Decoder
    from gpufleet.diagnose.reader import decode_stream, open_log
    from gpufleet.diagnose.report import analyse
    from gpufleet.domain.catalog import load_default_catalog

    here = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "kernel-logs"
    cat = load_default_catalog()
    faults = right = kind_right = benign_reported = lines = 0
    for case in tomllib.loads((here / "manifest.toml").read_text(encoding="utf-8"))["fixture"]:
        if not case.get("heldout"):
            continue
        dec = Decoder(cat, year=int(case.get("year", 2025)))
        with open_log(str(here / case["file"])) as fh:
            found = analyse(decode_stream(fh, dec), cat, dec.stats).findings
        lines += dec.stats.lines
        got = {(f.line, f.kind.value, f.code, f.pci): f.severity.value for f in found}
        want = {(e["line"], e["kind"], e.get("code"), e.get("pci")): e["severity"] for e in case["expect"]}
        faults += len(want)
        kind_right += len(want.keys() & got.keys())
        right += sum(1 for k, sev in want.items() if got.get(k) == sev)
        benign_reported += len(got.keys() - want.keys())
    return {"lines": lines, "fault_lines": faults, "decoded_right": right, "kind_code_device_right": kind_right,
            "benign_lines_reported": benign_reported,
            "right_pct": round(100 * right / faults, 1) if faults else None}


def _export(rev: str, into: Path) -> Path:
    """``src/`` of git revision ``rev`` under ``into``."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def compare(rev: str, path: Path, rounds: int, tmp: Path) -> dict[str, object]:
    """This tree against ``rev`` on ``path``, alternating runs; best round of each, and new / old."""
    old_src = _export(rev, tmp / "baseline")
    out: dict[str, object] = {"revision": rev, "rounds": rounds}
    for mode in ("block", "line"):
        new_runs, old_runs = [], []
        for _ in range(rounds):
            old_runs.append(_measure(mode, path, old_src))
            new_runs.append(_measure(mode, path))
        best_new = max(new_runs, key=lambda r: float(r["lines_per_cpu_s"]))  # type: ignore[arg-type]
        best_old = max(old_runs, key=lambda r: float(r["lines_per_cpu_s"]))  # type: ignore[arg-type]
        out[mode] = {
            "new_lines_per_cpu_s": [r["lines_per_cpu_s"] for r in new_runs],
            "old_lines_per_cpu_s": [r["lines_per_cpu_s"] for r in old_runs],
            "new_over_old": round(float(best_new["lines_per_cpu_s"]) / float(best_old["lines_per_cpu_s"]), 2),  # type: ignore[arg-type]
            "peak_rss_mb_new_old": [best_new["peak_rss_mb"], best_old["peak_rss_mb"]],
            "findings_equal": best_new["findings"] == best_old["findings"],
            "findings_new_old": [best_new["findings"], best_old["findings"]],
        }
    return out


def run(quick: bool) -> dict[str, object]:
    small, large = (5_000_000, 20_000_000) if quick else (100_000_000, 1_000_000_000)
    results: dict[str, object] = {"fault_every_lines": FAULT_EVERY, "heldout": heldout()}
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-diagnose-", dir="/tmp") as tmp:
        a, b = Path(tmp) / "small.log", Path(tmp) / "large.log"
        t0 = time.perf_counter()
        _write(a, small)
        _write(b, large)
        results["generate_s"] = round(time.perf_counter() - t0, 1)
        block_small = _measure("block", a)
        line_small = _measure("line", a)
        block_large = _measure("block", b)
        rev = os.environ.get("BENCH_DIAGNOSE_BASELINE")
        if rev:
            rounds = int(os.environ.get("BENCH_DIAGNOSE_ROUNDS", "3"))
            results["baseline"] = compare(rev, a, rounds, Path(tmp))
    results["small"] = {"bytes": small, "block": block_small, "per_line": line_small}
    results["large"] = {"bytes": large, "block": block_large}
    results["block_vs_per_line_speedup"] = round(
        float(block_small["lines_per_cpu_s"]) / float(line_small["lines_per_cpu_s"]), 2  # type: ignore[arg-type]
    )
    results["rss_large_over_small"] = round(
        float(block_large["peak_rss_mb"]) / float(block_small["peak_rss_mb"]), 2  # type: ignore[arg-type]
    )
    results["findings_equal_block_vs_line"] = block_small["findings"] == line_small["findings"]
    return results
