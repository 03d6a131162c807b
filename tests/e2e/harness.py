"""End-to-end harness: a real ``gpufleet controller serve`` process and real ``gpufleet agent --device sim``
processes talking HTTP on 127.0.0.1, each with its own log file, all stopped by PID at teardown.

The one rule of these tests: no sleeping for timing. Everything waits on a condition through
:func:`wait_until` (poll with a deadline; the failure message says what was awaited and what was seen).

Pieces:

* :class:`Fleet` (the ``fleet`` fixture): owns every process a test starts, its work directory and
  logs; stopped and its logs attached to the report when the test fails (see ``conftest.py``).
* :meth:`Fleet.controller` writes a controller config (SQLite in the test's tmp dir, an admin and an
  agent token, a policy file, an optional topology file, ``scheduler = "sim"`` or ``"slurm"``), starts
  the process, waits until ``/v1/health`` answers and registers the nodes (state ``ready``).
* :meth:`Fleet.agent` starts one agent (``--device sim --controller URL --token-file F --node NAME
  --state-dir D``) with extra CLI arguments (``--inject``, ``--kmsg-file`` ...) and waits until the
  controller has its first heartbeat.
* :class:`Api`: the controller's public HTTP API as the tests read it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
ADMIN_TOKEN = "e2e-admin-" + "a" * 24
AGENT_TOKEN = "e2e-agent-" + "b" * 24
T = TypeVar("T")

# Tests control the breaker themselves; the default budget (10 % of the fleet) would hold every
# decision on a fleet of three nodes. Short retries so a failed scheduler call is retried quickly.
BASE_POLICY = """\
[policy]
checkpoint_poll = "0.2s"
auto_repair = false
[breaker]
max_unavailable_fleet = 1.0
max_unavailable_domain = 1.0
[reconciler]
retry_base = "0.2s"
retry_cap = "1s"
"""


# Agents read fast: a heartbeat every second (the harness knows an agent is up from its first one), NVML
# counters (NVLink, ECC) every second instead of every 30 s, InfiniBand every half second.
AGENT_CONFIG = """\
heartbeat_s = 1
[cadence]
fast_s = 0.5
slow_s = 1
ib_s = 0.5
host_s = 30
"""


class WaitTimeout(AssertionError):
    pass


def wait_until(check: Callable[[], T | Literal[False] | None], what: str | Callable[[], str],
               timeout: float = 15.0, interval: float = 0.1) -> T:
    """Poll ``check`` until it returns something truthy and return that; fail after ``timeout`` s.

    ``what`` (or what it returns, evaluated at the deadline) says what was awaited and what was seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            text = what if isinstance(what, str) else what()
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for: {text}")
        time.sleep(interval)


def dmesg_now(messages: Sequence[str], *, proc_root: Path = Path("/proc")) -> str:
    """``messages`` as a dmesg-form kernel log whose lines are stamped just before now, in seconds
    since this machine's boot (the agent places them after ``btime``, as it does on a real node).

    A fixed stamp would place the fault at a wall-clock time that moves with the machine's uptime,
    and once it falls before the node's last transition the policy rightly treats it as stale."""
    from gpufleet.agent.collectors.kmsg import boot_time

    boot = boot_time(proc_root)
    assert boot is not None, f"no btime in {proc_root / 'stat'}"
    up = (datetime.now(UTC) - boot).total_seconds()
    n = len(messages)
    return "".join(f"[{max(up - (n - i) * 0.001, 0.0):12.6f}] {m}\n" for i, m in enumerate(messages))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a spawned gpufleet process: this worktree's source first on the path, no
    GPUFLEET_* settings leaking in from the caller's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def gpufleet_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufleet.cli", *args]


def run_cli(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a short ``gpufleet`` command (topology generate, agent --print-inventory ...) to completion."""
    proc = subprocess.run(gpufleet_argv(*args), env=child_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"gpufleet {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc


@dataclass
class Proc:
    """One spawned process; stdout and stderr go to ``log``."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes]

    @classmethod
    def spawn(cls, name: str, argv: list[str], log: Path, env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            out.write(f"$ {' '.join(argv)}\n".encode())
            out.flush()
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=dict(env or child_env()), cwd=cwd, start_new_session=True)
        return cls(name, argv, log, popen)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self, tail: int = 20_000) -> str:
        try:
            data = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return data[-tail:]

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` s; returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode


class Api:
    """The controller's public HTTP API (``/v1``), read with the admin token."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params={k: v for k, v in params.items() if v is not None})
        r.raise_for_status()
        return r.json()

    def post(self, path: str, body: Any) -> Any:
        r = self.http.post(path, json=body)
        r.raise_for_status()
        return r.json()

    def answers(self) -> bool:
        try:
            return self.http.get("/health").status_code == 200
        except httpx.TransportError:
            return False

    # ---- reads the tests use ---------------------------------------------------------------
    def node(self, node: str) -> dict[str, Any]:
        out: dict[str, Any] = self.get(f"/nodes/{node}")
        return out

    def node_state(self, node: str) -> str:
        return str(self.node(node)["node"]["state"])

    def events(self, node: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.get("/events", node=node, kind=kind, limit=1000)
        return out

    def decisions(self, node: str | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.get("/decisions", node=node, limit=1000)
        return out

    def actions(self, node: str | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.get("/actions", node=node, limit=1000)
        return out

    def verdicts(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.get("/verdicts")["suspects"]
        return out

    def breaker(self) -> dict[str, Any]:
        out: dict[str, Any] = self.get("/breaker")
        return out

    def audit(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = self.get("/audit", limit=1000)
        return out


@dataclass
class Controller:
    proc: Proc
    api: Api
    root: Path
    token_file: Path
    nodes: list[str]

    @property
    def url(self) -> str:
        return self.api.url.removesuffix("/v1")


@dataclass
class Agent:
    node: str
    proc: Proc
    state_dir: Path
    args: tuple[str, ...]


@dataclass
class Fleet:
    """Every process one test starts; :meth:`close` stops them all (agents first)."""

    root: Path
    procs: list[Proc] = field(default_factory=list)
    apis: list[Api] = field(default_factory=list)
    ctl: Controller | None = None
    agents: dict[str, Agent] = field(default_factory=dict)

    # ---- controller -------------------------------------------------------------------------
    def controller(self, *, nodes: Sequence[str] | Mapping[str, str], policy: str = BASE_POLICY,
                   topology: Path | None = None, scheduler: str = "sim", slurm_conf: str | None = None,
                   extra_config: str = "", timeout: float = 30.0, leaves: Mapping[str, Sequence[str]] | None = None,
                   sim_jobs: Sequence[tuple[str, str, Sequence[str]]] = (),
                   unregistered: Sequence[str] = ()) -> Controller:
        """Start ``gpufleet controller serve`` and register ``nodes`` (a list, or node -> rack) as ready.
        ``unregistered``: nodes the simulated scheduler has and the controller is not told about.

        With ``scheduler = "sim"`` the simulated scheduler starts with the same nodes (through its state
        file), so drains have somewhere to go; with ``"slurm"`` pass the lab's ``slurm_conf``. ``leaves``:
        the leaf switches each node's NICs land on (its switch domains); ``sim_jobs``: (id, name, nodes) of
        jobs the simulated scheduler runs from the start."""
        assert self.ctl is None, "one controller per test"
        root = self.root / "controller"
        root.mkdir(parents=True, exist_ok=True)
        racks = dict(nodes) if isinstance(nodes, Mapping) else {n: "r01" for n in nodes}
        (root / "policy.toml").write_text(policy)
        token_file = self.root / "agent-token"
        token_file.write_text(AGENT_TOKEN + "\n")
        lines = [
            f'database_url = "sqlite:///{root / "controller.db"}"',
            f'policy_file = "{root / "policy.toml"}"',
            'host = "127.0.0.1"',
            f"port = {free_port()}",
            "reconcile_interval = 0.1",
            f'scheduler = "{scheduler}"',
        ]
        if topology is not None:
            lines.append(f'topology_file = "{topology}"')
        if slurm_conf is not None:
            lines.append(f'slurm_conf = "{slurm_conf}"')
        if extra_config:
            lines.append(extra_config)
        lines += [
            "", "[[tokens]]", 'name = "e2e-admin"', 'role = "admin"', f'token = "{ADMIN_TOKEN}"',
            "", "[[tokens]]", 'name = "e2e-agents"', 'role = "agent"', f'token = "{AGENT_TOKEN}"', 'nodes = ["*"]',
        ]
        config = root / "controller.toml"
        config.write_text("\n".join(lines) + "\n")
        argv = gpufleet_argv("controller", "serve", "--config", str(config), "--log-level", "INFO")
        if scheduler == "sim":
            state = root / "sim-scheduler.json"
            jobs = [[j, name, "running", list(on), 0] for j, name, on in sim_jobs]
            state.write_text(json.dumps({"nodes": [[n, False, False, ""] for n in [*racks, *unregistered]],
                                         "jobs": jobs,
                                         "next_job": len(jobs) + 1, "effects": []}))
            argv += ["--sim-state", str(state)]
        port = int(lines[3].split("=")[1])
        proc = Proc.spawn("controller", argv, root / "controller.log", cwd=root)
        self.procs.append(proc)
        api = Api(f"http://127.0.0.1:{port}/v1")
        self.apis.append(api)
        wait_until(lambda: api.answers() or not proc.alive,
                   lambda: f"controller answering /v1/health; log:\n{proc.text(4000)}", timeout)
        if not proc.alive:
            raise AssertionError(f"controller exited {proc.popen.returncode}; log:\n{proc.text(6000)}")
        if racks:
            api.post("/nodes", {"nodes": [{"id": n, "rack": r, "leaves": list((leaves or {}).get(n, ()))}
                                          for n, r in racks.items()], "state": "ready"})
        self.ctl = Controller(proc, api, root, token_file, list(racks))
        return self.ctl

    def kill_controller(self) -> None:
        """SIGKILL the controller (no shutdown of any kind: what a crash or the OOM killer does)."""
        assert self.ctl is not None
        proc = self.ctl.proc.popen
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def restart_controller(self, timeout: float = 30.0) -> Controller:
        """Start the controller again with the same config, database and port (after :meth:`kill_controller`)."""
        assert self.ctl is not None and not self.ctl.proc.alive, "kill the controller first"
        old = self.ctl.proc
        proc = Proc.spawn("controller", old.argv, old.log, cwd=self.ctl.root)
        self.procs.append(proc)
        self.ctl.proc = proc
        api = self.ctl.api
        wait_until(lambda: api.answers() or not proc.alive,
                   lambda: f"restarted controller answering /v1/health; log:\n{proc.text(4000)}", timeout)
        if not proc.alive:
            raise AssertionError(f"restarted controller exited {proc.popen.returncode}; log:\n{proc.text(6000)}")
        return self.ctl

    def sim_scheduler_effects(self) -> list[tuple[str, str, str]]:
        """The simulated scheduler's effects so far (``("drain", node, reason)`` ...), from its state file."""
        assert self.ctl is not None
        doc = json.loads((self.ctl.root / "sim-scheduler.json").read_text())
        return [(str(e[0]), str(e[1]), str(e[2])) for e in doc["effects"]]

    # ---- agents -----------------------------------------------------------------------------
    def agent(self, node: str, *args: str, wait: bool = True, timeout: float = 20.0,
              env: Mapping[str, str] | None = None, config: str = "") -> Agent:
        """Start ``gpufleet agent --device sim`` for ``node`` with extra ``args``; by default wait until the
        controller has its heartbeat. The kernel log is off unless ``args`` name one (the machine's own
        /dev/kmsg is not the test's); the simulated device brings its own simulated sysfs (InfiniBand).
        ``config``: top-level settings put before the harness's agent config (e.g. ``maintenance_scripts``)."""
        assert self.ctl is not None, "start the controller first"
        if node in self.agents and self.agents[node].proc.alive:
            raise AssertionError(f"agent {node} is already running")
        state = self.root / "agents" / node / "state"
        state.mkdir(parents=True, exist_ok=True)
        argv = gpufleet_argv("agent", "--device", "sim", "--controller", self.ctl.url,
                             "--token-file", str(self.ctl.token_file), "--node", node, "--state-dir", str(state),
                             "--metrics-port", "0", "--metrics-addr", "127.0.0.1", "--log-level", "INFO")
        if not any(a.startswith(("--kmsg", "--no-kmsg")) for a in args):
            argv.append("--no-kmsg")
        argv += list(args)
        runs = sum(1 for p in self.procs if p.name == f"agent {node}")
        conf = self.root / "agents" / node / f"agent-{runs + 1}.toml"
        conf.write_text(config + AGENT_CONFIG)
        argv += ["--config", str(conf)]
        proc = Proc.spawn(f"agent {node}", argv, self.root / "agents" / node / f"agent-{runs + 1}.log",
                          env=child_env(env))
        self.procs.append(proc)
        agent = Agent(node, proc, state, tuple(args))
        self.agents[node] = agent
        if wait:
            before = self.ctl.api.node(node)["node"]["last_heartbeat"] if node in self.ctl.nodes else None
            wait_until(lambda: not proc.alive or self._beat_after(node, before),
                       lambda: f"a heartbeat from agent {node}; log:\n{proc.text(4000)}", timeout)
            if not proc.alive:
                raise AssertionError(f"agent {node} exited {proc.popen.returncode}; log:\n{proc.text(6000)}")
        return agent

    def _beat_after(self, node: str, before: str | None) -> bool:
        assert self.ctl is not None
        try:
            beat = self.ctl.api.node(node)["node"]["last_heartbeat"]
        except httpx.HTTPStatusError:
            return False
        return beat is not None and beat != before

    def stop_agent(self, node: str) -> None:
        agent = self.agents[node]
        code = agent.proc.stop()
        assert code in (0, -signal.SIGTERM), f"agent {node} exited {code}; log:\n{agent.proc.text(4000)}"

    # ---- teardown and diagnostics -----------------------------------------------------------
    def close(self) -> list[str]:
        """Stop everything (agents, then the controller); returns complaints about unclean exits."""
        problems: list[str] = []
        for p in sorted(self.procs, key=lambda p: p.name == "controller"):
            was_alive = p.alive
            code = p.stop()
            if was_alive and code not in (0, -signal.SIGTERM):
                problems.append(f"{p.name} exited {code} on SIGTERM")
        for api in self.apis:
            api.close()
        return problems

    def logs(self) -> Iterable[tuple[str, str]]:
        for p in self.procs:
            yield f"{p.name} ({p.log})", p.text()


# ---- topology helpers (read the generated file, the public gpufleet.topology/v1 format) -----------
@dataclass(frozen=True)
class TopologyFile:
    path: Path
    doc: dict[str, Any]

    @classmethod
    def generate(cls, out: Path, *args: str) -> TopologyFile:
        run_cli("topology", "generate", *args, "--out", str(out))
        return cls(out, json.loads(out.read_text()))

    def components(self, kind: str) -> list[dict[str, Any]]:
        return [c for c in self.doc["components"] if c["kind"] == kind]

    def component(self, cid: str) -> dict[str, Any]:
        return next(c for c in self.doc["components"] if c["id"] == cid)

    def children(self, parent: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [c for c in self.doc["components"] if c["parent"] == parent and (kind is None or c["kind"] == kind)]

    def links_of(self, cid: str, kind: str | None = None) -> list[dict[str, Any]]:
        """Links with ``cid`` at one end, in file order."""
        return [lk for lk in self.doc["links"] if cid in (lk["a"], lk["b"]) and (kind is None or lk["kind"] == kind)]

    def racks(self) -> dict[str, str]:
        """Every schedulable unit (node or compute tray) -> its rack."""
        return {c["id"]: c["parent"] or "r01" for c in self.doc["components"] if c["kind"] in ("node", "compute_tray")}


def attach_logs(item: pytest.Item, fleet: Fleet) -> list[tuple[str, str]]:
    return [(f"e2e log: {name}", text) for name, text in fleet.logs()]
