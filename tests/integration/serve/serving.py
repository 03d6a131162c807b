"""A real ``gpufleet controller serve`` process for the tests that must go through it: started from a
config file on a free port, waited for until ``/v1/health`` answers, stopped with SIGTERM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "serve-test-admin-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(workdir: Path, database_url: str, settings: str = "", *, name: str = "c",
            timeout_s: float = 90.0) -> Iterator[str]:
    """``controller serve`` on ``database_url`` with the simulated scheduler, an admin token and
    ``settings`` (more TOML); yields its API base (``http://127.0.0.1:<port>/v1``) once it answers."""
    port = free_port()
    config = workdir / f"{name}.toml"
    config.write_text(f'database_url = "{database_url}"\nscheduler = "sim"\nhost = "127.0.0.1"\nport = {port}\n'
                      f'{settings}\n[[tokens]]\nname = "admin"\nrole = "admin"\ntoken = "{TOKEN}"\n',
                      encoding="utf-8")
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "controller", "serve", "--config", str(config),
                                 "--sim-nodes", "2"], cwd=ROOT, stdout=out, stderr=out,
                                env={**os.environ, "GPUFLEET_SCHEDULER": "sim"})
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert proc.poll() is None, f"controller serve exited {proc.returncode}: {log.read_text()[-2000:]}"
            try:
                if httpx.get(f"{base}/health", headers=HEADERS, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"controller serve did not answer in {timeout_s} s: " \
                                                f"{log.read_text()[-2000:]}"
            time.sleep(0.1)  # polling for a process to come up, not timing anything
        yield base
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
