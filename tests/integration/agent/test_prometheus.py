"""A real Prometheus (started here, torn down by PID) scrapes the agent and evaluates the shipped rules."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.agent.clock import SystemClock
from gpufleet.agent.config import load_config
from gpufleet.agent.devices.sim import SimDevice
from tests.conftest import require_service
from tests.integration.agent.harness import running_agent, wait_for
from tests.unit.agent.controller_double import free_port

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "gpufleet-agent.rules.yml"
FIX = ROOT / "tests" / "fixtures" / "sysfs"

pytestmark = pytest.mark.prometheus


@pytest.fixture
def promtool() -> str:
    require_service(shutil.which("promtool") is not None, "promtool binary")
    return str(shutil.which("promtool"))


def test_rules_file_checks(promtool: str) -> None:
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rules_unit_tests(promtool: str) -> None:
    out = subprocess.run(
        [promtool, "test", "rules", "gpufleet-agent.rules.test.yml"],
        cwd=RULES.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_broken_rule_is_caught(promtool: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text(RULES.read_text().replace("gpufleet_gpu_lost == 1", "gpufleet_gpu_lost == (1"))
    out = subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True, text=True, check=False)
    assert out.returncode != 0


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    require_service(shutil.which("prometheus") is not None, "prometheus binary")
    yield tmp_path, free_port()


def query(base: str, q: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/api/v1/query", params={"query": q}, timeout=10).json()
    assert r["status"] == "success", r
    return list(r["data"]["result"])


def test_prometheus_scrapes_the_agent(prometheus: tuple[Path, int]) -> None:
    tmp, prom_port = prometheus
    clock = SystemClock()
    sim = SimDevice(4, clock=clock, seed=5)
    cfg = load_config(
        None,
        node="r01-n003",
        device="sim",
        gpus=4,
        push=False,
        metrics_port=0,
        metrics_addr="127.0.0.1",
        kmsg=False,
        ib_root=FIX / "h100-degraded",
        state_dir=tmp / "state",
        cadence={"slow_s": 1.0},
    )
    with running_agent(cfg, sim, clock) as agent:
        sim.inject_xid(0, 31)
        sim.inject_xid(0, 31)
        sim.inject_xid(1, 94)
        sim.set_row_remap(2, failure=True)
        sim.fall_off_bus(3)
        wait_for(
            lambda: (
                agent.metrics().get(
                    "gpufleet_gpu_lost{Hostname=r01-n003,UUID=GPU-00000005-0000-4000-8000-000000000003,"
                    "device=nvidia3,gpu=3,modelName=NVIDIA H100 80GB HBM3,pci_bus_id=0000:5d:00.0}"
                )
                == 1
            ),
            "GPU 3 lost",
        )
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{RULES}']\n"
            "scrape_configs:\n"
            "  - job_name: gpufleet-agent\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{agent.port}']}}]\n"
        )
        log = (tmp / "prometheus.log").open("w")
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{prom_port}"
        try:

            def ready() -> bool:
                try:
                    return bool(query(base, "gpufleet_gpu_xid_errors_total"))
                except (httpx.HTTPError, ValueError):
                    return False

            wait_for(ready, "Prometheus to scrape the agent", 90)
            wait_for(lambda: bool(query(base, "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1")), "remap failure series", 30)
            xid = {
                (r["metric"]["gpu"], r["metric"]["xid"]): float(r["value"][1])
                for r in query(base, "gpufleet_gpu_xid_errors_total")
            }
            assert xid == {("0", "31"): 2.0, ("1", "94"): 1.0, ("3", "79"): 1.0}
            [last] = query(base, 'DCGM_FI_DEV_XID_ERRORS{gpu="0"}')
            assert last["metric"]["Hostname"] == "r01-n003" and last["metric"]["job"] == "gpufleet-agent"
            assert float(last["value"][1]) == 31
            assert float(query(base, "count(DCGM_FI_DEV_GPU_UTIL)")[0]["value"][1]) == 3  # GPU 3 is lost
            [remap] = query(base, "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1")
            assert remap["metric"]["gpu"] == "2"
            [down] = query(base, "gpufleet_ib_port_active == 0")
            assert down["metric"]["device"] == "mlx5_2"

            def firing() -> set[str]:
                alerts = httpx.get(f"{base}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
                return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}

            wait_for(lambda: {"GpuFellOffBus", "GpuRowRemapFailure"} <= firing(), "alerts to fire", 60)
            targets = httpx.get(f"{base}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
            assert [t["health"] for t in targets] == ["up"]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
