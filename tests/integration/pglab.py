"""A throwaway PostgreSQL cluster of a test's own (scripts/pg-lab.sh), for tests that stop and start the
database itself: an outage no shared test database may suffer."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import require_service
from tests.unit.agent.controller_double import free_port

ROOT = Path(__file__).resolve().parents[2]


class PgLab:
    def __init__(self, root: Path) -> None:
        self.env = dict(os.environ, PG_LAB=str(root / "pg"), PG_LAB_PORT=str(free_port()))
        self.url = ""

    def run(self, *args: str) -> str:
        done = subprocess.run([str(ROOT / "scripts/pg-lab.sh"), *args], check=False, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def up(self) -> None:
        out = self.run("up")
        self.url = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("export DATABASE_URL="))

    def down(self) -> None:
        self.run("down")


@contextmanager
def pg_lab() -> Iterator[PgLab]:
    """A running cluster (``.url``), stopped and deleted afterwards; skipped (failed in CI) without the
    PostgreSQL server binaries."""
    require_service(any(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")), "PostgreSQL server binaries")
    root = Path(tempfile.mkdtemp(prefix="gpufleet-pglab-", dir="/tmp"))
    root.chmod(0o755)
    lab = PgLab(root)
    try:
        lab.up()
        yield lab
    finally:
        lab.run("down", "--purge")
        shutil.rmtree(root, ignore_errors=True)
