"""Agent overhead: CPU and RSS of ``gpufleet agent --device sim --gpus 8`` at 1 Hz (goal < 1 % of one core,
< 80 MB RSS), side by side with the same agent watching 0 GPUs (the interpreter + loop baseline).

Each agent is a real subprocess (the CLI an operator runs), reading 8 recorded InfiniBand ports at 1 Hz
too and following /dev/kmsg through the diagnose decoder when it is readable, with no push. A
Prometheus-like client scrapes both every 15 s. CPU = utime+stime from /proc over the measured window
(after a warm-up); RSS = VmRSS sampled every 5 s (max and last).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
IB = ROOT / "tests" / "fixtures" / "sysfs" / "h100-healthy"
TICK = os.sysconf("SC_CLK_TCK")
KMSG = os.access("/dev/kmsg", os.R_OK)  # follow the real kernel log (through the diagnose decoder) if we may


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _start(gpus: int, state: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    exe = str(Path(sys.executable).parent / "gpufleet")
    proc = subprocess.Popen(
        [
            exe,
            "agent",
            "--device",
            "sim",
            "--gpus",
            str(gpus),
            "--no-push",
            "--metrics-port",
            str(port),
            "--metrics-addr",
            "127.0.0.1",
            "--ib-root",
            str(IB),
            "--kmsg" if KMSG else "--no-kmsg",
            "--state-dir",
            str(state),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            return proc, port
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("agent did not start")


def run(quick: bool) -> dict[str, object]:
    duration = 20.0 if quick else 300.0
    warmup = 5.0
    with tempfile.TemporaryDirectory() as tmp:
        agents = {name: _start(gpus, Path(tmp) / name) for name, gpus in (("sim8", 8), ("sim0", 0))}
        try:
            time.sleep(warmup)
            cpu0 = {n: _cpu_s(p.pid) for n, (p, _) in agents.items()}
            rss: dict[str, list[float]] = {n: [] for n in agents}
            scrape_ms: dict[str, list[float]] = {n: [] for n in agents}
            series: dict[str, int] = {}
            client = httpx.Client(timeout=10)
            t0 = time.monotonic()
            next_scrape = t0
            while (now := time.monotonic()) - t0 < duration:
                if now >= next_scrape:
                    for n, (_, port) in agents.items():
                        s = time.perf_counter()
                        text = client.get(f"http://127.0.0.1:{port}/metrics").text
                        scrape_ms[n].append((time.perf_counter() - s) * 1000)
                        series[n] = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
                    next_scrape += 15.0
                for n, (p, _) in agents.items():
                    rss[n].append(_rss_mb(p.pid))
                time.sleep(5.0)
            elapsed = time.monotonic() - t0
            client.close()
            out: dict[str, object] = {"duration_s": round(elapsed, 1), "tick_hz": 1.0, "kmsg": KMSG}
            for n, (p, _) in agents.items():
                cpu = _cpu_s(p.pid) - cpu0[n]
                out[n] = {
                    "cpu_pct_of_one_core": round(100 * cpu / elapsed, 3),
                    "cpu_s": round(cpu, 2),
                    "rss_mb_max": round(max(rss[n]), 1),
                    "rss_mb_last": round(rss[n][-1], 1),
                    "scrape_ms_median": round(sorted(scrape_ms[n])[len(scrape_ms[n]) // 2], 2),
                    "series": series[n],
                }
        finally:
            for p, _ in agents.values():
                p.terminate()
                p.wait(timeout=30)
    s8, s0 = out["sim8"], out["sim0"]
    assert isinstance(s8, dict) and isinstance(s0, dict)
    out["goal"] = {"cpu_pct": 1.0, "rss_mb": 80.0}
    out["ratio_cpu_to_goal"] = round(s8["cpu_pct_of_one_core"] / 1.0, 3)
    out["ratio_rss_to_goal"] = round(s8["rss_mb_max"] / 80.0, 3)
    out["ratio_cpu_sim8_to_sim0"] = round(s8["cpu_s"] / max(s0["cpu_s"], 0.01), 2)
    out["meets_goal"] = s8["cpu_pct_of_one_core"] < 1.0 and s8["rss_mb_max"] < 80.0
    return out
