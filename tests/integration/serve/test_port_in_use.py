"""A second ``controller serve`` on a port already in use fails at once, naming the port, and touches
nothing (no database is created or migrated)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_serve_on_a_used_port_fails_before_migrating(tmp_path: Path) -> None:
    db = tmp_path / "second.db"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "controller.toml"
        cfg.write_text(f'database_url = "sqlite:///{db}"\nhost = "127.0.0.1"\nport = {port}\nscheduler = "sim"\n')
        out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "controller", "serve", "--config", str(cfg)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2, out.stderr
    assert f"port: got {port}" in out.stderr and "another controller" in out.stderr
    assert not db.exists(), "the database was created although the controller could not serve"
