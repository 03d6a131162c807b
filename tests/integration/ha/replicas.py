"""Controller replica processes for the HA tests (tests/integration/ha/child.py), and what they show.

Each replica's processes are forked by its own fork server (tests/integration/forkserver.py): real
processes killed with real signals, the controller's modules imported once per replica rather than at
each of the failover storm's 20+ restarts."""

from __future__ import annotations

import os
import signal
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.integration.forkserver import Forked, ForkServer
from tests.integration.ha.child import TOKEN

ROOT = Path(__file__).resolve().parents[3]
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Replica:
    workdir: Path
    name: str
    db_url: str
    lease_s: float
    renew_s: float
    proc: Forked | None = None
    server: ForkServer | None = None
    base: str = ""
    started: float = field(default=0.0)
    settings: str = ""  # more settings (TOML: [tls], [ha], [[tokens]]; child.py)
    tls: ssl.SSLContext | None = None  # with [tls]: how the test's requests reach it (https)

    @property
    def port_file(self) -> Path:
        return self.workdir / f"{self.name}.port"

    def start(self) -> None:
        self.port_file.unlink(missing_ok=True)
        self.base = ""
        extra = []
        if self.settings:
            extra = [str(self.workdir / f"{self.name}.toml")]
            Path(extra[0]).write_text(self.settings, encoding="utf-8")
        if self.server is None:
            self.server = ForkServer("tests.integration.ha.child", self.workdir / f"{self.name}.forkserver.log")
        self.proc = self.server.spawn([str(self.workdir), self.name, self.db_url, str(self.lease_s), str(self.renew_s),
                                       *extra], self.workdir / f"{self.name}.log")
        self.started = time.monotonic()

    def serving(self, timeout: float = 60.0) -> bool:
        """Wait (polling) until it serves; False if it died."""
        deadline = time.monotonic() + timeout
        while not self.port_file.exists():
            if not self.alive:
                return False
            assert time.monotonic() < deadline, f"{self.name} did not start within {timeout} s: {self.log_tail()}"
            time.sleep(0.05)
        self.base = f"{self.scheme}://127.0.0.1:{self.port_file.read_text()}"
        return True

    def ready(self) -> bool:
        """Whether it serves now (no waiting): picks up its port once it has written it."""
        if not self.base and self.alive and self.port_file.exists():
            self.base = f"{self.scheme}://127.0.0.1:{self.port_file.read_text()}"
        return bool(self.base) and self.alive

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def health(self) -> dict[str, object] | None:
        """Its /v1/health (role, epoch), or None when it does not answer."""
        if not self.ready():
            return None
        try:
            r = httpx.get(f"{self.base}/v1/health", headers=HEADERS, timeout=2, verify=self.tls or True)
        except httpx.TransportError:
            return None
        return r.json() if r.status_code == 200 else None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def kill9(self) -> None:
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)  # (a stopped process dies of SIGKILL too; this is for tidiness)
            self.proc.kill9()

    def close(self) -> None:
        """Kill it and end its fork server (a fixture's teardown)."""
        self.kill9()
        if self.server is not None:
            self.server.close()
            self.server = None

    def log_tail(self) -> str:
        path = self.workdir / f"{self.name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


def leader(replicas: list[Replica], *, above: int = 0, timeout: float = 30.0) -> tuple[Replica, int]:
    """Poll until exactly one live replica says it leads, at an epoch above ``above``: it and its epoch.
    Fails if two ever say so at once."""
    deadline = time.monotonic() + timeout
    while True:
        leading = []
        for r in replicas:
            h = r.health()
            if h is not None and h.get("role") == "leader":
                leading.append((r, int(str(h["epoch"]))))
        epochs = {e for _, e in leading}
        assert len(epochs) == len(leading), f"two replicas lead at one epoch: {[(r.name, e) for r, e in leading]}"
        fresh = [(r, e) for r, e in leading if e > above]
        if fresh:
            return max(fresh, key=lambda x: x[1])
        assert time.monotonic() < deadline, (f"no leader above epoch {above} within {timeout} s: "
                                             + " | ".join(f"{r.name}: {r.log_tail()[-600:]}" for r in replicas))
        time.sleep(0.05)


def settled(replicas: list[Replica], *, timeout: float = 30.0) -> tuple[Replica, int]:
    """The leader and its epoch once every live replica knows where it serves (followers forward there)."""
    deadline = time.monotonic() + timeout
    current, epoch = leader(replicas, timeout=timeout)
    while any((h := r.health()) is None or h.get("leader_url") != current.base for r in replicas if r.alive):
        assert time.monotonic() < deadline, "the replicas did not learn where the leader serves"
        time.sleep(0.05)
    return current, epoch
