"""A real Prometheus scrapes a real controller (and a real agent) and evaluates the shipped rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import require_service
from tests.e2e.harness import Fleet, wait_until
from tests.e2e.prometheus import RULES, VIEWER_CONFIG, VIEWER_TOKEN, agent_metrics_port, start_prometheus

pytestmark = [pytest.mark.e2e, pytest.mark.prometheus]
CONTROLLER_RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "gpufleet-controller.rules.yml"


@pytest.fixture
def promtool() -> str:
    require_service(shutil.which("promtool") is not None, "promtool binary")
    return str(shutil.which("promtool"))


def test_controller_rules_check_and_pass_their_unit_tests(promtool: str) -> None:
    assert CONTROLLER_RULES in RULES
    out = subprocess.run([promtool, "check", "rules", str(CONTROLLER_RULES)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([promtool, "test", "rules", "gpufleet-controller.rules.test.yml"], cwd=CONTROLLER_RULES.parent,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_expectation_fails_promtool(promtool: str, tmp_path: Path) -> None:
    test = CONTROLLER_RULES.with_name("gpufleet-controller.rules.test.yml").read_text()
    bad = tmp_path / "t.yml"
    (tmp_path / CONTROLLER_RULES.name).write_text(CONTROLLER_RULES.read_text())
    bad.write_text(test.replace("value: 0.09", "value: 0.5"))
    out = subprocess.run([promtool, "test", "rules", str(bad)], cwd=tmp_path, capture_output=True, text=True,
                         check=False)
    assert out.returncode != 0


def test_prometheus_scrapes_the_controller(fleet: Fleet) -> None:
    ctl = fleet.controller(nodes={"n1": "r01", "n2": "r01"}, extra_config=VIEWER_CONFIG)
    fleet.agent("n1", "--inject", "xid:79@gpu1")
    host = ctl.url.removeprefix("http://")
    r = httpx.get(f"{ctl.url}/metrics", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}, timeout=10)
    assert r.status_code == 200 and "gpufleet_nodes{" in r.text
    assert httpx.get(f"{ctl.url}/metrics", timeout=10).status_code == 401
    wait_until(lambda: ctl.api.node_state("n1") in ("draining", "drained"), "n1 drained for its XID 79")
    prom = start_prometheus(fleet, host, [f"127.0.0.1:{agent_metrics_port(fleet, 'n1')}"])
    wait_until(lambda: prom.answers('gpufleet_nodes{job="gpufleet-controller"}'), "the controller's series", 60)
    wait_until(lambda: prom.answers('gpufleet_gpu_xid_errors_total{job="gpufleet-agent"}'), "the agent's series", 60)
    assert {t["labels"]["job"]: t["health"] for t in prom.targets()} == {
        "gpufleet-controller": "up", "gpufleet-agent": "up"}
    states = {r["metric"]["state"]: float(r["value"][1]) for r in prom.query("gpufleet_nodes")}
    assert sum(states.values()) == len(ctl.api.get("/nodes")) == 2
    # n1 may move on between the scrape and now (draining -> drained); n2 saw nothing.
    assert states["draining"] + states["drained"] == 1
    assert states["ready"] + states["in_service"] == 1
    decided = prom.query('sum(gpufleet_decisions_total{rule="fatal_event"})')
    assert decided and float(decided[0]["value"][1]) >= 1
    wait_until(lambda: prom.answers('gpufleet_actions_total{kind="drain",outcome="done"}'), "the drain counted", 30)
    wait_until(lambda: prom.answers("gpufleet_detect_to_drain_seconds_count > 0"), "detect-to-drain observed", 30)
    wait_until(lambda: prom.answers('gpufleet_ingest_requests_total{route="heartbeat",code="200"}'),
               "heartbeats counted", 30)
    wait_until(lambda: prom.answers("gpufleet:ingest_events:rate5m"), "the recording rule evaluated", 30)
    assert prom.query("gpufleet_breaker_tripped")[0]["value"][1] == "0"
