"""The Grafana dashboards in deploy/grafana: written by scripts/grafana_dashboards.py (they cannot drift from
it), well-formed, and every panel's query answers with data from a real Prometheus that scraped a real
controller and a real agent (markers ``e2e`` and ``prometheus``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.goodput.push import GoodputPusher
from tests.e2e.harness import ADMIN_TOKEN, REPO, Fleet, TopologyFile, wait_until
from tests.e2e.prometheus import VIEWER_CONFIG, agent_metrics_port, start_prometheus
from tests.e2e.test_goodput_push import write_run

GRAFANA = REPO / "deploy" / "grafana"
SCRIPT = REPO / "scripts" / "grafana_dashboards.py"


def dashboards() -> dict[str, dict[str, Any]]:
    found = {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}
    assert set(found) == {"fleet-health.json", "fabric.json", "goodput.json"}, sorted(found)
    return found


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]


def test_the_shipped_dashboards_are_what_the_generator_writes(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    # The check can fail: a hand edit to a shipped file is caught.
    copy = tmp_path / "deploy" / "grafana"
    copy.mkdir(parents=True)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / SCRIPT.name).write_text(SCRIPT.read_text())
    for name, doc in dashboards().items():
        doc["panels"][1]["targets"][0]["expr"] += " * 2" if name == "fabric.json" else ""
        (copy / name).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    bad = subprocess.run([sys.executable, str(tmp_path / "scripts" / SCRIPT.name), "--check"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 1 and "fabric.json" in bad.stderr and "goodput.json" not in bad.stderr, bad.stderr


def test_every_panel_is_well_formed() -> None:
    for name, doc in dashboards().items():
        assert doc["uid"].startswith("gpufleet-") and doc["schemaVersion"] >= 36, name
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids)), name
        for p in doc["panels"]:
            grid = p["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (name, p["title"])
            if p["type"] != "row":
                assert p["targets"] and p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                for t in p["targets"]:  # plain PromQL that cannot answer by itself
                    assert "$" not in t["expr"] and "vector(" not in t["expr"], (name, p["title"])


@pytest.mark.e2e
@pytest.mark.prometheus
def test_every_dashboard_query_returns_data(fleet: Fleet, tmp_path: Path) -> None:
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "4")
    nodes = sorted(topo.racks())
    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path, extra_config=VIEWER_CONFIG)
    fleet.agent(nodes[0], "--inject", "xid:79@gpu1", "--inject", "ib_down@nic5")
    wait_until(lambda: ctl.api.node_state(nodes[0]) in ("draining", "drained"), f"{nodes[0]} drained for its XID")
    # A training run reports its goodput the way a job does (the goodput panels read it).
    write_run(tmp_path / "run", time.time() - 400)
    pushed = GoodputPusher(tmp_path / "run", ctl.url, ADMIN_TOKEN, job="train-1").push_once()
    assert pushed.accepted > 0 and pushed.failed_posts == 0
    prom = start_prometheus(fleet, ctl.url.removeprefix("http://"),
                            [f"127.0.0.1:{agent_metrics_port(fleet, nodes[0])}"])
    wanted = [(name, title, expr) for name, doc in dashboards().items() for title, expr in queries(doc)]
    assert len(wanted) >= 30

    def silent() -> list[tuple[str, str, str]]:
        return [w for w in wanted if not prom.answers(w[2])]

    wait_until(lambda: not silent(), lambda: "every dashboard query to return data; still empty:\n"
               + "\n".join(f"  {n} / {t}: {e}" for n, t, e in silent()), 90, interval=1.0)
    # An unknown series returns nothing: answering is not automatic.
    assert not prom.answers("gpufleet_no_such_series")
