"""The BMC executor, SEL ingestion and firmware inventory against real Redfish services (sushy-tools'
``sushy-emulator --fake`` and ``sushy-static`` processes, tests/integration/bmc/emulators.py), inside a
controller on a real store (SQLite) with the simulated scheduler and a manual clock. The node's agent is
played through the command queue, as in tests/integration/reconciler/test_repair_ladder.py."""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from gpufleet.controller.api.app import create_app
from gpufleet.controller.bmc.credentials import BmcTarget, Secret
from gpufleet.controller.bmc.redfish import RedfishBmc
from gpufleet.controller.bmc.watcher import BmcWatcher
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.executors.agent import AgentExecutor
from gpufleet.controller.executors.bmc import BmcExecutor
from gpufleet.controller.executors.ticket import TicketExecutor
from gpufleet.controller.reconciler import Reconciler
from gpufleet.controller.repairer import Repairer
from gpufleet.controller.service import Controller
from gpufleet.controller.settings import TokenConfig
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.controller.store.repo import Page, Store
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.fleet import simulated_fleet
from gpufleet.lifecycle.config import parse_policy
from gpufleet.schedulers.sim import SimScheduler
from tests.e2e.harness import wait_until
from tests.integration.bmc.emulators import Mockup, Service, free_port, make_ca, start_emulator, start_static
from tests.integration.reconciler.test_repair_ladder import Tickets

pytestmark = pytest.mark.redfish

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
POLICY = {"breaker": {"max_unavailable_fleet": 1.0, "max_unavailable_domain": 1.0},
          "policy": {"heartbeat_timeout": "0s", "checkpoint_poll": "5s"},
          "repair": {"step_timeout": "10m"}}
USER = "gf-bmc-" + secrets.token_hex(4)
PASSWORD = "Pw-" + secrets.token_hex(12)  # unique per run: any occurrence anywhere is a leak
UUID0 = "5a7c2f9e-1f54-4b8e-9d0a-0c8f7a1e2b30"


@pytest.fixture
def tickets() -> Iterator[Tickets]:
    t = Tickets()
    yield t
    t.server.shutdown()


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Service]:
    svc = start_emulator(tmp_path / "emulator", {"node0": UUID0}, USER, PASSWORD)
    yield svc
    svc.stop()


class World:
    def __init__(self, tmp: Path, tickets: Tickets, bmcs: dict[str, RedfishBmc], *, tries: int = 5) -> None:
        self.url = f"sqlite:///{tmp / 'g.db'}"
        self.clock = ManualClock(T0)
        self.tickets, self.bmcs, self.tries = tickets, bmcs, tries
        fleet = simulated_fleet(4, 1)
        self.ids = [n.id for n in fleet]
        self.s = SimScheduler(self.ids)
        self.restart()
        self.c.register_fleet(fleet)

    def restart(self) -> None:
        engine = make_engine(self.url)
        migrate(engine)
        self.c = Controller(Store(engine), parse_policy(POLICY), self.clock)
        self.repairs = RepairStore(self.c.store)
        executors = {"agent": AgentExecutor(self.repairs, self.clock),
                     "bmc": BmcExecutor(self.bmcs, off_wait=30, poll=0.2),
                     "ticket": TicketExecutor(self.tickets.url)}
        self.r = Reconciler(self.c, self.s, repairer=Repairer(self.c, executors, start_tries=self.tries,
                                                              retry_base=timedelta(seconds=4)))
        self.watcher = BmcWatcher(self.c, self.bmcs)

    def step(self, seconds: float = 6) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.r.run_once()

    def state(self, node: str) -> str:
        return str(self.c.state_of(node))

    def agent_answers(self, node: str, ok: bool) -> list[str]:
        done = []
        for cmd in self.repairs.pending(node):
            self.repairs.finish(node, cmd.id, ok, f"{cmd.kind} {'done' if ok else 'refused'}", self.clock.now())
            done.append(cmd.kind)
        return done

    def audit_text(self) -> str:
        return "\n".join(f"{a.action} {a.target} {a.detail}" for a in self.c.store.audit(page=Page(5000)))

    def actions_text(self) -> str:
        return "\n".join(f"{a.result} {a.last_error} {a.progress}" for a in self.c.store.actions(page=Page(500)))

    def take_out(self, node: str, code: int) -> None:
        n = len(self.c.store.events(node=node, page=Page(1000)))
        self.c.ingest([HealthEvent(f"{node}-xid-{n}", node, EventKind.XID, self.clock.now(), f"{node}-gpu0", code)])
        for _ in range(3):
            self.step()
        assert self.state(node) == "repair"


def bmc_of(svc_url: str, node: str, system: str = "", password: str = PASSWORD) -> RedfishBmc:
    return RedfishBmc(BmcTarget(node, svc_url, Secret(USER), Secret(password), system), timeout=5)


def assert_no_credentials(*texts: str) -> None:
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for text in texts:
        assert PASSWORD not in text and basic not in text and USER not in text


def test_power_cycle_is_the_rung_after_reboot_and_returns_the_node(
        tmp_path: Path, tickets: Tickets, emulator: Service, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every library's debug logging too (sushy, urllib3)
    w = World(tmp_path, tickets, {})
    n = w.ids[0]
    w.bmcs[n] = bmc_of(emulator.url, n, UUID0)
    w.restart()
    w.take_out(n, 48)  # ECC DBE: reset_gpu -> with a BMC: GPU reset, reboot, power cycle
    assert w.agent_answers(n, ok=False) == ["gpu_reset"]
    w.step()
    w.step()
    assert w.agent_answers(n, ok=False) == ["reboot"]
    assert "ForceOff" not in emulator.text()
    w.step()
    w.step()  # the power cycle: ForceOff, wait for Off, On
    assert f'System "{UUID0}" power state set to "ForceOff"' in emulator.text()
    wait_until(lambda: (w.step(2), w.state(n) == "revalidate")[1], lambda: f"revalidate; {w.actions_text()}", 60)
    log = emulator.text()
    assert log.index('power state set to "ForceOff"') < log.index('power state set to "On"')
    hist = w.repairs.history(n, T0)
    assert [(a.step.value, a.ok) for a in hist] == [("gpu_reset", False), ("reboot", False), ("power_cycle", True)]
    validate = next(x for x in w.c.store.actions(node=n, page=Page(100)) if x.kind == "validate")
    assert validate.level == "full"
    r = httpx.get(f"{emulator.url}/redfish/v1/Systems/{UUID0}", auth=(USER, PASSWORD), timeout=5)
    assert r.json()["PowerState"] == "On"
    assert_no_credentials(caplog.text, w.audit_text(), w.actions_text())


def test_pxe_boot_override_once(emulator: Service, mockup: tuple[Mockup, Service],
                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = f"{emulator.url}/redfish/v1/Systems/{UUID0}"
    before = httpx.get(url, auth=(USER, PASSWORD), timeout=5).json()["Boot"]["BootSourceOverrideTarget"]
    assert before != "Pxe"
    bmc = bmc_of(emulator.url, "node0", UUID0)
    bmc.boot_once_pxe()
    after = httpx.get(url, auth=(USER, PASSWORD), timeout=5).json()["Boot"]
    assert after["BootSourceOverrideTarget"] == "Pxe"
    assert bmc.boot_override()[0] == "Pxe"
    # sushy-emulator's fake driver does not model BootSourceOverrideEnabled (it always says "Continuous");
    # sushy-static logs every PATCH body it receives: the request asks for the next boot only
    _, static = mockup
    assert "BootSourceOverrideEnabled" not in static.text()
    bmc_of(static.url, "node0").boot_once_pxe()
    patch = static.text()
    assert '"BootSourceOverrideEnabled": "Once"' in patch and '"BootSourceOverrideTarget": "Pxe"' in patch
    assert_no_credentials(caplog.text)


def test_wrong_credentials_fail_without_echoing_them(emulator: Service, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "Wrong-" + secrets.token_hex(8)
    bmc = bmc_of(emulator.url, "node0", UUID0, password=wrong)
    with pytest.raises(Exception) as err:
        bmc.power_state()
    assert "401" in str(err.value) and wrong not in str(err.value) and wrong not in caplog.text


def test_a_bmc_over_https_is_trusted_through_the_site_ca_bundle_and_refused_without_it(tmp_path: Path) -> None:
    tls = make_ca(tmp_path / "tls")
    svc = start_emulator(tmp_path / "emulator-tls", {"node0": UUID0}, USER, PASSWORD, tls=tls)
    try:
        assert svc.url.startswith("https://")
        trusted = RedfishBmc(BmcTarget("node0", svc.url, Secret(USER), Secret(PASSWORD), UUID0),
                             ca_bundle=tls[0], timeout=5)
        assert trusted.power_state() == "On"
        untrusted = bmc_of(svc.url, "node0", UUID0)  # the system trust store does not know the site CA
        with pytest.raises(Exception) as err:
            untrusted.power_state()
        assert "CERTIFICATE_VERIFY_FAILED" in str(err.value) or "certificate verify failed" in str(err.value)
        assert_no_credentials(str(err.value))
    finally:
        svc.stop()


def test_unreachable_bmc_is_retried_with_backoff_then_the_ladder_files_a_ticket(
        tmp_path: Path, tickets: Tickets, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    w = World(tmp_path, tickets, {}, tries=3)
    n = w.ids[1]
    w.bmcs[n] = bmc_of(f"http://127.0.0.1:{free_port()}", n)  # nothing listens there
    w.restart()
    w.take_out(n, 79)  # fell off the bus: reboot -> with a BMC: reboot, power cycle
    assert w.agent_answers(n, ok=False) == ["reboot"]
    tries_seen = []
    for _ in range(40):
        w.step(3)
        a = next(x for x in w.c.store.actions(node=n, page=Page(100)) if x.kind == "repair")
        if "try" in (a.result or ""):
            tries_seen.append(a.result)
        if tickets.bodies:
            break
    assert len({t.split(" failed")[0] for t in tries_seen}) == 2, tries_seen  # tries 1 and 2 waited, 3 gave up
    assert "again in 0:00:04" in tries_seen[0] and "again in 0:00:08" in tries_seen[-1]
    assert len(tickets.bodies) == 1
    body = tickets.bodies[0]
    assert body["node"] == n and body["kind"] == "hardware"
    assert [(h["step"], h["ok"]) for h in body["history"]] == [("reboot", False), ("power_cycle", False)]
    pc = [a for a in w.repairs.history(n, T0) if a.step.value == "power_cycle"]
    assert len(pc) == 1 and not pc[0].ok
    assert "bmc unreachable after 3 tries" in w.audit_text()
    assert_no_credentials(caplog.text, w.audit_text(), w.actions_text(), str(tickets.bodies))


@pytest.fixture
def mockup(tmp_path: Path) -> Iterator[tuple[Mockup, Service]]:
    m = Mockup(tmp_path / "mockup")
    svc = start_static(m.root, tmp_path / "static.log")
    yield m, svc
    svc.stop()


def test_sel_entries_become_judged_events_once_across_polls_and_restarts(
        tmp_path: Path, tickets: Tickets, mockup: tuple[Mockup, Service], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    m, svc = mockup
    w = World(tmp_path, tickets, {})
    n = w.ids[2]
    w.bmcs[n] = bmc_of(svc.url, n)
    w.restart()
    t = w.clock.now()
    m.add_entry("1", t - timedelta(minutes=5), sensor="Memory", severity="Warning",
                message="Correctable ECC logging limit reached on DIMM B3")
    m.add_entry("2", t - timedelta(minutes=4), sensor="Fan", severity="Warning", message="Fan 3 lower critical",
                code="Deassert")  # a condition that ended: not an event
    m.add_entry("3", t - timedelta(minutes=3), sensor="OS Boot", severity="OK", message="OS boot completed")
    m.add_entry("4", t - timedelta(days=3), sensor="Temperature", severity="Critical", message="Inlet temp high")
    assert w.watcher.poll_sel() == 1  # only the DIMM: the deassert, the OK line and the 3-day-old entry are not
    assert w.state(n) == "ready"  # correctable: info, recorded only
    m.add_entry("5", t - timedelta(seconds=30), sensor="Power Supply / Converter", severity="Critical",
                message="Power supply PSU2 failure detected")
    assert w.watcher.poll_sel() == 1
    assert w.watcher.poll_sel() == 0  # the same entries read again
    w.restart()  # a new controller and watcher on the same database: nothing twice
    assert w.watcher.poll_sel() == 0
    rows = {r.attrs.get("rule"): r for r in w.c.store.events(node=n, page=Page(100))}
    assert set(rows) == {"bmc_memory_ce", "bmc_psu"}
    assert rows["bmc_memory_ce"].severity == "info" and rows["bmc_psu"].severity == "degraded"  # the catalog's
    assert rows["bmc_psu"].source == "bmc" and rows["bmc_psu"].attrs["bmc_severity"] == "Critical"
    assert rows["bmc_psu"].kind == "check_failed"
    w.step()
    assert w.state(n) in ("draining", "drained")  # an idle node with degraded evidence drains at once
    decision = w.c.store.decisions(node=n, page=Page(10))[0]
    assert rows["bmc_psu"].id in decision.evidence
    assert_no_credentials(caplog.text, w.audit_text())


def test_firmware_inventory_and_drift_through_the_api(tmp_path: Path, tickets: Tickets,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    a = Mockup(tmp_path / "a")
    b = Mockup(tmp_path / "b", bios="1.6.0", gpu_versions=("96.00.89.00.01", "96.00.61.00.01"))
    sa, sb = start_static(a.root, tmp_path / "a.log"), start_static(b.root, tmp_path / "b.log")
    try:
        w = World(tmp_path, tickets, {})
        w.bmcs.update({w.ids[0]: bmc_of(sa.url, w.ids[0]), w.ids[1]: bmc_of(sa.url, w.ids[1]),
                       w.ids[2]: bmc_of(sb.url, w.ids[2])})
        w.restart()
        assert w.watcher.poll_firmware() == 3
        token = "viewer-" + "v" * 24
        app = create_app(w.c, [TokenConfig(name="v", role="viewer", token=token)], bmc=w.watcher)
        with TestClient(app) as client:
            assert client.get("/v1/firmware").status_code == 401
            r = client.get("/v1/firmware", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        nodes = {x["node"]: x for x in r.json()["nodes"]}
        assert nodes[w.ids[0]]["bmc"] == "2.10.4" and nodes[w.ids[2]]["bios"] == "1.6.0"
        drift = {(x["node"], c["component"]) for x in r.json()["nodes"] for c in x["components"] if c["drift"]}
        assert drift == {(w.ids[2], "BIOS"), (w.ids[2], "GPU 1 VBIOS")}
        assert_no_credentials(r.text, caplog.text)
    finally:
        sa.stop()
        sb.stop()
