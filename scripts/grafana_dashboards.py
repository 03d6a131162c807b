"""Write the Grafana dashboards in deploy/grafana from code (run after changing a panel):

    python scripts/grafana_dashboards.py          # writes deploy/grafana/*.json
    python scripts/grafana_dashboards.py --check  # exits 1 when a file differs from what this writes

Three dashboards over the series of the controller (docs/metrics.md, job ``gpufleet-controller``) and
the agents (docs/agent.md, job ``gpufleet-agent``): fleet health, fabric, goodput. Every query is plain
PromQL with fixed windows (no Grafana variables inside a query), so tests/e2e/test_grafana.py can ask
a real Prometheus each one as written. The datasource is a dashboard variable, picked on import.

Grafana's dashboard JSON (schemaVersion 39, Grafana 10/11) is written directly: the generator is ~150
lines and needs no library.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana"
DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Panel:
    title: str
    exprs: tuple[tuple[str, str], ...]  # (PromQL, legend)
    kind: str = "timeseries"  # timeseries | stat | bargauge | table
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[Panel, ...]], ...]


def q(expr: str, legend: str = "") -> tuple[str, str]:
    return (expr, legend)


FLEET = Dashboard("gpufleet-fleet-health", "gpufleet / fleet health",
                  "Nodes by state, decisions, the breaker, actions and the controller's own health.", (
    ("Fleet", (
        Panel("Nodes out of service", (q("gpufleet:nodes_out:ratio"),), "stat", "percentunit",
              "Share of nodes draining, drained, in repair or revalidating (recording rule).", 6, 5),
        Panel("Breaker", (q("gpufleet_breaker_tripped"),), "stat", "short",
              "1 while the blast-radius breaker is tripped: decisions are held for an operator.", 6, 5),
        Panel("Held decisions", (q("gpufleet_held_decisions"),), "stat", "short",
              "Decisions the breaker holds (approve or cancel them in the web UI).", 6, 5),
        Panel("Dry run", (q("gpufleet_dry_run"),), "stat", "short", "1 while dry run is on.", 6, 5),
        Panel("Nodes by state", (q("sum by (state) (gpufleet_nodes)", "{{state}}"),), "timeseries", "short",
              "Every lifecycle state, 0 included.", 24),
    )),
    ("Decisions and actions", (
        Panel("Decisions by rule (1h)", (q("sum by (rule, status) (increase(gpufleet_decisions_total[1h]))",
                                           "{{rule}} {{status}}"),), "bargauge"),
        Panel("Actions by outcome (rate)", (q("sum by (kind, outcome) (rate(gpufleet_actions_total[5m]))",
                                              "{{kind}} {{outcome}}"),), "timeseries", "ops"),
        Panel("Detect to drain p90 (1h)", (q("gpufleet:detect_to_drain_seconds:p90_1h"),), "timeseries", "s",
              "From the decision to the scheduler confirming the drain."),
        Panel("Breaker trips (24h)", (q("increase(gpufleet_breaker_trips_total[24h])"),), "stat"),
    )),
    ("Controller", (
        Panel("Ingest: events per second", (q("gpufleet:ingest_events:rate5m", "{{outcome}}"),), "timeseries", "ops"),
        Panel("Ingest p99 latency", (q("gpufleet:ingest_request_seconds:p99_5m", "{{route}}"),), "timeseries", "s"),
        Panel("Ingest queue depth", (q("gpufleet_ingest_queue_depth"),), "timeseries"),
        Panel("Reconciler pass p99", (q("histogram_quantile(0.99, sum by (le) "
                                        "(rate(gpufleet_reconciler_pass_seconds_bucket[5m])))"),), "timeseries", "s"),
        Panel("Scheduler reachable", (q("gpufleet_scheduler_reachable"),), "stat"),
        Panel("Agents reporting", (q("sum(up{job=\"gpufleet-agent\"})"),), "stat", "short",
              "Agent exporters Prometheus scrapes successfully."),
    )),
))

FABRIC = Dashboard("gpufleet-fabric", "gpufleet / fabric",
                   "InfiniBand ports and NVLink as the agents read them, and the correlator's verdicts.", (
    ("InfiniBand", (
        Panel("IB ports active", (q("sum(gpufleet_ib_port_active)"),), "stat", "short", "", 8, 5),
        Panel("IB ports not active", (q("sum(1 - gpufleet_ib_port_active)"),), "stat", "short", "", 8, 5),
        Panel("IB link rate", (q("avg(gpufleet_ib_port_rate_gbps)"),), "stat", "Gbits", "", 8, 5),
        Panel("Link downed (1h) by node", (q("sum by (Hostname) (increase(gpufleet_ib_link_downed[1h]))",
                                             "{{Hostname}}"),), "bargauge"),
        Panel("Receive errors (rate) by port", (q("sum by (Hostname, device) (rate(gpufleet_ib_port_rcv_errors[5m]))",
                                                  "{{Hostname}} {{device}}"),), "timeseries", "ops"),
        Panel("Link error recovery (1h)", (q("sum by (Hostname) (increase(gpufleet_ib_link_error_recovery[1h]))",
                                             "{{Hostname}}"),), "bargauge"),
    )),
    ("NVLink", (
        Panel("NVLinks down", (q("sum(1 - gpufleet_gpu_nvlink_up)"),), "stat"),
        Panel("NVLink errors (rate) by type", (q("sum by (type) (rate(gpufleet_gpu_nvlink_errors[5m]))", "{{type}}"),),
              "timeseries", "ops"),
    )),
    ("Correlation", (
        Panel("Standing verdicts", (q("sum by (kind, action) (gpufleet_correlation_suspects)", "{{kind}} {{action}}"),),
              "bargauge", "short", "The shared parts (switches, cables, trays, GPUs) the correlator blames now.", 24),
    )),
))

GOODPUT = Dashboard("gpufleet-goodput", "gpufleet / goodput",
                    "What faults cost the training jobs: capacity lost, interruptions, time to get a node out, "
                    "and GPU use on the nodes in service.", (
    ("Capacity", (
        Panel("Schedulable share", (q("sum(gpufleet_nodes{state=~\"ready|in_service\"}) / sum(gpufleet_nodes)"),),
              "stat", "percentunit", "Nodes ready or in service, of all registered.", 8, 5),
        Panel("Nodes running jobs", (q("sum(gpufleet_nodes{state=\"in_service\"})"),), "stat", "short", "", 8, 5),
        Panel("Capacity lost", (q("gpufleet:nodes_out:ratio"),), "timeseries", "percentunit",
              "Share of the fleet out of service (drained, repairing, revalidating).", 8, 5),
    )),
    ("Interruptions", (
        Panel("Nodes taken out (24h)",
              (q("sum(increase(gpufleet_node_transitions_total{to_state=\"draining\"}[24h]))"),),
              "stat", "short", "Each one interrupts the job it ran (or would have)."),
        Panel("Decisions carried out by rule (24h)",
              (q("sum by (rule) (increase(gpufleet_decisions_total{status=\"applied\"}[24h]))", "{{rule}}"),),
              "bargauge"),
        Panel("Detect to drain p90", (q("gpufleet:detect_to_drain_seconds:p90_1h"),), "timeseries", "s"),
        Panel("Drain and requeue outcomes (1h)", (q("sum by (kind, outcome) (increase(gpufleet_actions_total[1h]))",
                                                    "{{kind}} {{outcome}}"),), "bargauge", "short",
              "waiting: a drain polling for the job's checkpoint before it takes the node (docs/lifecycle.md)."),
    )),
    ("Training goodput (reported by the jobs' recorders)", (
        Panel("Cluster ETTR (reported)", (q("sum(gpufleet_goodput_seconds_total{category=\"productive\"}) / "
                                            "sum(gpufleet_goodput_seconds_total)"),),
              "stat", "percentunit", "Productive share of the rank-seconds jobs reported since the controller "
              "started (GET /v1/goodput has any time range).", 6, 5),
        Panel("Cluster MFU (reported)", (q("sum(gpufleet_goodput_model_flops_total) / "
                                           "sum(gpufleet_goodput_peak_flops_total)"),),
              "stat", "percentunit", "Model FLOPs over peak FLOPs of the reported steps (jobs that declared "
              "their model).", 6, 5),
        Panel("Badput by category (6h)", (q("sum by (category) (increase(gpufleet_goodput_seconds_total"
                                            "{category!=\"productive\"}[6h]))", "{{category}}"),),
              "bargauge", "s", "Rank-seconds lost, by cause, in intervals received in the last 6 hours.", 12, 5),
        Panel("ETTR by job", (q("topk(20, gpufleet_goodput_job_ettr)", "{{job}}"),), "bargauge", "percentunit",
              "The jobs that reported most recently (at most 20).", 12),
        Panel("MFU by job", (q("topk(20, gpufleet_goodput_job_mfu)", "{{job}}"),), "bargauge", "percentunit",
              "", 12),
    )),
    ("GPUs", (
        Panel("GPU utilisation", (q("avg(DCGM_FI_DEV_GPU_UTIL)"),), "timeseries", "percent"),
        Panel("XID errors (1h) by code",
              (q("sum by (xid) (increase(gpufleet_gpu_xid_errors_total[1h]))", "XID {{xid}}"),), "bargauge"),
    )),
))

DASHBOARDS = (FLEET, FABRIC, GOODPUT)
FILES = {"gpufleet-fleet-health": "fleet-health.json", "gpufleet-fabric": "fabric.json",
         "gpufleet-goodput": "goodput.json"}


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = [{"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "refId": chr(ord("A") + i),
                "range": p.kind == "timeseries", "instant": p.kind != "timeseries"}
               for i, (expr, legend) in enumerate(p.exprs)]
    out: dict[str, Any] = {"id": pid, "type": p.kind, "title": p.title, "datasource": DS, "targets": targets,
                           "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
                           "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []}, "options": {}}
    if p.description:
        out["description"] = p.description
    if p.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "colorMode": "value", "graphMode": "area"}
    if p.kind == "bargauge":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "orientation": "horizontal", "displayMode": "gradient"}
    return out


def render(d: Dashboard) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row_title, row in d.rows:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, tallest = pid + 1, y + 1, 0, 0
        for p in row:
            if x + p.width > 24:
                x, y, tallest = 0, y + tallest, 0
            panels.append(_panel(p, pid, x, y))
            pid, x, tallest = pid + 1, x + p.width, max(tallest, p.height)
        y += tallest
    return {
        "uid": d.uid, "title": d.title, "description": d.description, "tags": ["gpufleet"],
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timezone": "utc",
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []}, "links": [], "panels": panels,
    }


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query in a dashboard document."""
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]


def text(d: Dashboard) -> str:
    return json.dumps(render(d), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a file differs")
    args = ap.parse_args(argv)
    stale = []
    for d in DASHBOARDS:
        path = OUT / FILES[d.uid]
        if args.check:
            if not path.exists() or path.read_text() != text(d):
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text(d))
        print(f"wrote {path}")
    if stale:
        print("out of date (run python scripts/grafana_dashboards.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
