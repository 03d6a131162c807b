"""Walk the path of one kernel-log XID — agent (kernel-log reader, decoder, spool, push) -> HTTP ->
controller (ingest, judgement, correlation, policy, decision) — in one process, and count judgements.

Issue #12: an observation is judged once, by the controller, with the site's catalog
(:func:`gpufleet.domain.judgement.judge`); the agent judges nothing. The test fails if the path gains a
second judgement: a second call of ``judge`` for the same observation, a call on the agent's side, or
any read of the catalog outside ``judge`` (which is what a second, private judging rule would do).

Calls are counted with a profiler hook on every thread (``sys.setprofile``/``threading.setprofile``),
so a judging function is seen however it was imported; nothing is patched or mocked.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import httpx
import pytest

from gpufleet.agent.app import run_agent
from gpufleet.agent.config import AgentConfig
from gpufleet.controller.runtime import build
from gpufleet.controller.settings import ControllerSettings, TokenConfig
from gpufleet.domain import judgement
from gpufleet.domain.catalog import Catalog
from gpufleet.schedulers.sim import SimScheduler
from tests.e2e.harness import ADMIN_TOKEN, AGENT_TOKEN, TopologyFile, dmesg_now, wait_until

pytestmark = pytest.mark.e2e

NODE = "r01-n01"
# A recorded kernel log (dmesg) with one XID 79 (fatal in the shipped catalog).
KERNEL_MESSAGES = ("NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
                   "GPU has fallen off the bus.",)
_CATALOG_READS = ("lookup", "known", "severity", "entry", "_find")


@dataclass
class Call:
    what: str
    modules: tuple[str, ...]  # the calling stack's modules, innermost first
    in_judge: bool

    @property
    def side(self) -> str:
        if any(m.startswith("gpufleet.controller") for m in self.modules):
            return "controller"
        if any(m.startswith(("gpufleet.agent", "gpufleet.diagnose")) for m in self.modules):
            return "agent"
        return "other"


@dataclass
class JudgementSpy:
    """Records every call of ``judge`` and every catalog read, with the stack that made it."""

    judge: CodeType
    catalog: dict[CodeType, str]
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hook(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code is not self.judge and code not in self.catalog:
            return
        modules: list[str] = []
        in_judge = False
        f: FrameType | None = frame.f_back
        while f is not None:
            modules.append(str(f.f_globals.get("__name__", "?")))
            in_judge = in_judge or f.f_code is self.judge
            f = f.f_back
        what = "judge" if code is self.judge else f"Catalog.{self.catalog[code]}"
        with self.lock:
            self.calls.append(Call(what, tuple(modules), in_judge))

    @contextmanager
    def watching(self) -> Iterator[JudgementSpy]:
        threading.setprofile(self.hook)  # every thread started from here on
        sys.setprofile(self.hook)
        try:
            yield self
        finally:
            sys.setprofile(None)
            threading.setprofile(None)

    def of(self, what: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.what == what]


@contextmanager
def agent_thread(cfg: AgentConfig) -> Iterator[None]:
    """The real agent (``run_agent``, wired as ``gpufleet agent`` wires it) in a thread of this process."""
    stop, ready, errors = threading.Event(), threading.Event(), list[BaseException]()

    def target() -> None:
        try:
            run_agent(cfg, stop, ready=lambda _port: ready.set())
        except BaseException as err:
            errors.append(err)
            ready.set()

    t = threading.Thread(target=target, name="agent", daemon=True)
    t.start()
    assert ready.wait(30), "the agent did not start"
    try:
        if errors:
            raise errors[0]
        yield
    finally:
        stop.set()
        t.join(30)
    assert not t.is_alive(), "the agent did not stop"
    if errors:
        raise errors[0]


def test_one_kernel_log_xid_is_judged_once_by_the_controller_and_never_by_the_agent(tmp_path: Path) -> None:
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "2")
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text(dmesg_now(KERNEL_MESSAGES))
    (tmp_path / "policy.toml").write_text('[breaker]\nmax_unavailable_fleet = 1.0\nmax_unavailable_domain = 1.0\n')
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN)
    (tmp_path / "no-ib").mkdir()
    spy = JudgementSpy(judgement.judge.__code__,
                       {getattr(Catalog, n).__code__: n for n in _CATALOG_READS if hasattr(Catalog, n)})

    with spy.watching():
        settings = ControllerSettings(
            database_url=f"sqlite:///{tmp_path / 'controller.db'}", policy_file=tmp_path / "policy.toml",
            topology_file=topo.path, port=0, scheduler="sim", reconcile_interval=0.1,
            tokens=(TokenConfig(name="admin", role="admin", token=ADMIN_TOKEN),
                    TokenConfig(name="agents", role="agent", token=AGENT_TOKEN, nodes=("*",))))
        rt = build(settings, SimScheduler(sorted(topo.racks())))
        ports: list[int] = []
        rt.start_api(on_started=ports.append)
        rt.start_reconciler()
        api = httpx.Client(base_url=f"http://127.0.0.1:{ports[0]}/v1",
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
        try:
            r = api.post("/nodes", json={"nodes": [{"id": n, "rack": "r01"} for n in topo.racks()], "state": "ready"})
            r.raise_for_status()
            cfg = AgentConfig(node=NODE, device="sim", controller=f"http://127.0.0.1:{ports[0]}",
                              token_file=token_file, state_dir=tmp_path / "agent", metrics_port=0,
                              metrics_addr="127.0.0.1", ib_root=tmp_path / "no-ib", kmsg_file=kernel_log,
                              heartbeat_s=1)
            with agent_thread(cfg):
                def stored() -> list[dict[str, Any]]:
                    out: list[dict[str, Any]] = api.get("/events", params={"node": NODE}).json()
                    return out

                xid = wait_until(lambda: [e for e in stored() if e["kind"] == "xid" and e["code"] == 79],
                                 lambda: f"the kernel log's XID 79 stored; events: {stored()}")
                decisions = wait_until(lambda: api.get("/decisions", params={"node": NODE}).json(),
                                       "the XID's decision")
            observations = stored()
        finally:
            api.close()
            rt.shutdown()

    assert len(xid) == 1, xid
    assert [d["severity"] for d in decisions] == ["fatal"], decisions  # the judgement reached the policy
    judged = spy.of("judge")
    by_side = {side: [c for c in judged if c.side == side] for side in ("agent", "controller", "other")}
    assert by_side["agent"] == [], f"the agent judged: {by_side['agent']}"
    assert by_side["other"] == [], f"judged outside the controller: {by_side['other']}"
    assert len(by_side["controller"]) == len(observations), (
        f"{len(by_side['controller'])} judgements for {len(observations)} observation(s): "
        + "\n".join(" <- ".join(c.modules[:8]) for c in by_side["controller"]))
    private = [c for c in spy.calls if c.what != "judge" and not c.in_judge]
    assert private == [], "the catalog was read outside judge() (a second judgement):\n" + "\n".join(
        f"{c.what} <- {' <- '.join(c.modules[:8])}" for c in private)
