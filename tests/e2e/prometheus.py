"""A real Prometheus process for end-to-end tests: scrapes a real controller (with a viewer token) and
real agents, evaluates the shipped rule files, and answers PromQL queries."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import require_service
from tests.e2e.harness import Fleet, Proc, free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
RULES = sorted((REPO / "deploy" / "prometheus").glob("*.rules.yml"))
VIEWER_TOKEN = "e2e-viewer-" + "c" * 24
VIEWER_CONFIG = f'\n[[tokens]]\nname = "prometheus"\nrole = "viewer"\ntoken = "{VIEWER_TOKEN}"\n'


@dataclass
class Prometheus:
    proc: Proc
    url: str

    def query(self, q: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": q}, timeout=10).json()
        assert r["status"] == "success", (q, r)
        return list(r["data"]["result"])

    def answers(self, q: str) -> bool:
        try:
            return bool(self.query(q))
        except (httpx.HTTPError, ValueError):
            return False

    def targets(self) -> list[dict[str, Any]]:
        doc = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()
        return list(doc["data"]["activeTargets"])


def agent_metrics_port(fleet: Fleet, node: str) -> int:
    """The port the agent's log says it serves /metrics on (started with --metrics-port 0)."""
    proc = fleet.agents[node].proc

    def port() -> int | None:
        m = re.search(r"metrics on [\d.]+:(\d+)", proc.text())
        return int(m.group(1)) if m and m.group(1) != "0" else None

    return wait_until(port, lambda: f"the agent's metrics port in its log:\n{proc.text(3000)}")


def start_prometheus(fleet: Fleet, controller: str, agents: Sequence[str] = ()) -> Prometheus:
    """Prometheus scraping ``controller`` (host:port) every second with the viewer token, and
    ``agents`` (host:port each), with every rule file in deploy/prometheus loaded."""
    require_service(shutil.which("prometheus") is not None, "prometheus binary")
    root = fleet.root / "prometheus"
    root.mkdir(parents=True, exist_ok=True)
    (root / "token").write_text(VIEWER_TOKEN + "\n")
    targets = ", ".join(f"'{a}'" for a in agents)
    (root / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{', '.join(repr(str(r)) for r in RULES)}]\n"
        "scrape_configs:\n"
        "  - job_name: gpufleet-controller\n"
        f"    authorization: {{credentials_file: '{root / 'token'}'}}\n"
        f"    static_configs: [{{targets: ['{controller}']}}]\n"
        "  - job_name: gpufleet-agent\n"
        f"    static_configs: [{{targets: [{targets}]}}]\n")
    port = free_port()
    proc = Proc.spawn("prometheus", ["prometheus", f"--config.file={root / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={root / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}"], root / "prometheus.log")
    fleet.procs.append(proc)
    prom = Prometheus(proc, f"http://127.0.0.1:{port}")
    wait_until(lambda: not proc.alive or prom.answers("up"), lambda: f"Prometheus up; log:\n{proc.text(3000)}", 60)
    assert proc.alive, proc.text(3000)
    return prom
