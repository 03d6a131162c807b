"""``gpufleet fleet``: the operator's commands over the controller's API (no curl).

The controller is ``--url`` (or GPUFLEET_URL; default http://127.0.0.1:8470); the token comes from
``--token-file`` or GPUFLEET_TOKEN. Every command prints a table, or with ``--json`` the API's own JSON.
Errors the API answers become the CLI's exit codes (cli/errors.py): 2 invalid input or a refused token,
3 not found, 4 not allowed in the node's state, 5 the controller cannot be reached.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.domain.errors import Conflict, ExternalError, InvalidInput, NotFound

fleet_app = typer.Typer(help="Operate the fleet through the controller's API (status, nodes, drain, approve...).",
                        no_args_is_help=True)
DEFAULT_URL = "http://127.0.0.1:8470"
AsJson = Annotated[bool, typer.Option("--json", help="print the API's JSON instead of a table")]
Reason = Annotated[str, typer.Option(help="why (kept in the audit log)")]


def register(app: typer.Typer) -> None:
    from gpufleet.cli import fleet_events, fleet_verdicts  # noqa: F401 (their commands join fleet_app)

    app.add_typer(fleet_app, name="fleet")


@dataclass
class Client:
    url: str
    token: str

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        import httpx

        query = {k: v for k, v in params.items() if v is not None}
        try:
            r = httpx.request(method, f"{self.url}/v1{path}", json=body, params=query, timeout=30,
                              headers={"Authorization": f"Bearer {self.token}"})
        except httpx.HTTPError as err:
            raise ExternalError("controller", f"{self.url}: {err}") from None
        if r.status_code < 300:
            return r.json()
        detail = _detail(r)
        if r.status_code in (401, 403):
            raise InvalidInput("token", "(from --token-file or GPUFLEET_TOKEN)", f"a token the controller "
                               f"accepts for this ({r.status_code}: {detail})")
        if r.status_code == 404:
            raise ApiNotFound(method, path, detail)
        if r.status_code == 409:
            raise Conflict(detail)
        if r.status_code == 422:
            first = _first_field_error(r)
            if first is not None:  # the controller named the field: say it as it did
                raise InvalidInput(str(first.get("field")), first.get("value"), str(first.get("expected")))
            raise InvalidInput("request", path, detail)
        raise ExternalError("controller", f"{r.status_code} {detail}")


class ApiNotFound(NotFound):
    """A 404 from the controller, whose detail already says what was not found ("node 'x' not found")."""

    def __init__(self, method: str, path: str, detail: str) -> None:
        super().__init__(path.strip("/").split("/")[0].rstrip("s") or "route", path)
        self.args = (f"{detail} ({method} /v1{path})",)


def _first_field_error(r: Any) -> dict[str, Any] | None:
    try:
        d = r.json().get("detail")
    except (ValueError, AttributeError):
        return None
    if isinstance(d, list) and d and isinstance(d[0], dict) and "field" in d[0]:
        return d[0]
    return None


def _detail(r: Any) -> str:
    try:
        d = r.json().get("detail", r.text)
    except ValueError:
        return str(r.text)[:300]
    if isinstance(d, list):
        return "; ".join(f"{e.get('field')}: got {e.get('value')!r}, expected {e.get('expected')}" for e in d)
    return str(d)


def api_callback(app: typer.Typer, doc: str) -> None:
    """Give a command group the controller connection every API group shares: ``--url`` (env
    GPUFLEET_URL, default :data:`DEFAULT_URL`) and ``--token-file`` (else env GPUFLEET_TOKEN);
    :func:`_client` builds the client from them. ``doc`` is the group's help."""

    def _connect(
        ctx: typer.Context,
        url: Annotated[str | None, typer.Option(help=f"the controller (env GPUFLEET_URL; default {DEFAULT_URL})")]
        = None,
        token_file: Annotated[Path | None, typer.Option(help="a file holding the bearer token (else env "
                                                             "GPUFLEET_TOKEN)")] = None,
    ) -> None:
        ctx.obj = (url or os.environ.get("GPUFLEET_URL") or DEFAULT_URL, token_file)

    _connect.__doc__ = doc
    app.callback()(_connect)


api_callback(fleet_app, "Operate the fleet through the controller's API.")


def _client(ctx: typer.Context) -> Client:
    url, token_file = ctx.obj
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise InvalidInput("--token-file", str(token_file), f"a readable file holding a token ({err})") from None
    else:
        token = os.environ.get("GPUFLEET_TOKEN", "").strip()
    if token_file is not None and not token:
        raise InvalidInput("--token-file", str(token_file), "a file holding a token (this one is empty)")
    if not token:
        raise InvalidInput("GPUFLEET_TOKEN", "" if "GPUFLEET_TOKEN" in os.environ else None,
                           "a token, or --token-file FILE (neither was given; make one with `gpufleet "
                           "controller token`)")
    return Client(url.rstrip("/"), token)


def _out(doc: Any, as_json: bool, table: Any) -> None:
    if as_json:
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    from rich.console import Console

    Console(highlight=False).print(table(doc))


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    return t


def since_time(text: str) -> str:
    """A ``--since`` option: a time (ISO 8601 with a zone) or how long ago (2h, 7d), as the API's ISO time."""
    from datetime import UTC, datetime

    from gpufleet.domain.durations import parse_duration
    from gpufleet.domain.eventio import parse_time

    if text[:1].isdigit() and ("T" in text or "-" in text):
        return parse_time(text, "--since").isoformat()
    try:
        back = parse_duration(text, "--since")
    except InvalidInput:
        raise InvalidInput("--since", text, "a time (2026-11-28T12:00:00Z) or how long ago (2h, 7d)") from None
    return (datetime.now(UTC) - back).isoformat()


def _when(ts: str | None) -> str:
    return (ts or "")[:19].replace("T", " ")


@fleet_app.command()
def status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """The fleet at a glance: nodes by state, actions, the breaker, dry-run."""
    doc = _client(ctx).call("GET", "/status")

    def table(d: dict[str, Any]) -> Any:
        b = d["breaker"]
        rows: list[list[Any]] = [[f"nodes {s}", n] for s, n in sorted(d["nodes"].items())]
        rows += [[f"actions {s}", n] for s, n in sorted(d["actions"].items())]
        rows += [["events", d["events"]],
                 ["breaker", f"TRIPPED since {_when(b['since'])}: {b['reason']}" if b["tripped"] else "ok"],
                 ["held decisions", b["held"]], ["dry run", "on" if d["dry_run"] else "off"],
                 ["scheduler", "reachable" if d["scheduler_reachable"] else "UNREACHABLE"]]
        return _table("fleet status", ["what", "value"], rows)

    _out(doc, as_json, table)


@fleet_app.command()
def nodes(ctx: typer.Context, state: Annotated[str | None, typer.Option(help="only nodes in this state")] = None,
          rack: Annotated[str | None, typer.Option(help="only nodes in this rack")] = None,
          limit: Annotated[int, typer.Option(help="at most this many")] = 1000, as_json: AsJson = False) -> None:
    """List nodes with their state."""
    doc = _client(ctx).call("GET", "/nodes", state=state, rack=rack, limit=limit)
    _out(doc, as_json, lambda d: _table(f"{len(d)} node(s)", ["node", "rack", "state", "since", "jobs", "heartbeat"],
                                        [[n["id"], n["rack"], n["state"], _when(n["since"]), "yes" if n["has_jobs"]
                                          else "", _when(n["last_heartbeat"])] for n in d]))


@fleet_app.command()
def node(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the node id")],
         as_json: AsJson = False) -> None:
    """One node: its state, history, decisions, actions and recent events."""
    doc = _client(ctx).call("GET", f"/nodes/{name}")

    def table(d: dict[str, Any]) -> Any:
        from rich.console import Group

        n = d["node"]
        head = _table(f"node {n['id']} (rack {n['rack']}): {n['state']} since {_when(n['since'])}",
                      ["from", "to", "time", "by", "reason"],
                      [[t["from_state"], t["to_state"], _when(t["time"]), t["actor_id"], t["reason"]]
                       for t in d["history"][:20]])
        dec = _table("decisions", ["id", "time", "rule", "to", "status", "reason"],
                     [[x["id"], _when(x["time"]), x["rule"], x["to_state"], x["status"], x["reason"]]
                      for x in d["decisions"][:20]])
        act = _table("actions", ["id", "kind", "status", "attempts", "result / error"],
                     [[a["id"], a["kind"], a["status"], a["attempts"], a["last_error"] or a["result"]]
                      for a in d["actions"][:20]])
        ev = _table("events", ["time", "kind", "code", "component", "message"],
                    [[_when(e["time"]), e["kind"], e["code"], e["component"], e["message"]] for e in d["events"][:20]])
        return Group(head, dec, act, ev)

    _out(doc, as_json, table)


def _operate(ctx: typer.Context, name: str, op: str, reason: str, as_json: bool) -> None:
    doc = _client(ctx).call("POST", f"/nodes/{name}/{op}", {"reason": reason})
    _out(doc, as_json, lambda d: f"{d['node']}: {d['state']}" + (f" (decision {d['decision']})" if d.get("decision")
                                                                   else ""))


REGISTER_BATCH = 5_000  # nodes per POST /v1/nodes (the API takes up to 10,000)


@fleet_app.command("register")
def register_nodes(
    ctx: typer.Context,
    names: Annotated[list[str] | None, typer.Argument(
        help="node ids, as the scheduler names them (Slurm: NodeName); with --topology: only these")] = None,
    rack: Annotated[str | None, typer.Option(
        help="the rack of the named nodes (the drain budget counts per rack)")] = None,
    topology: Annotated[Path | None, typer.Option(
        help="register the topology file's nodes with their racks, serials, GPUs and leaf switches")] = None,
    ready: Annotated[bool, typer.Option("--ready", help="adopt them as in service; default: burn-in first")] = False,
    as_json: AsJson = False,
) -> None:
    """Register nodes with the controller (admin token); agents report only for registered nodes. Either name
    them with their --rack, or give the cluster's --topology (gpufleet topology generate/import), which also
    gives each node's leaf switches (its switch domains for the drain budget) and GPU serials."""
    state = "ready" if ready else "new"
    if topology is not None:
        if rack is not None:
            raise InvalidInput("--rack", rack, "no --rack with --topology (the topology names each node's rack)")
        nodes = _topology_nodes(topology, names or [])
    else:
        if not names:
            raise InvalidInput("names", "(none)", "node ids to register, or --topology FILE")
        if rack is None:
            raise InvalidInput("--rack", "(none)", "the rack of the named nodes (or --topology FILE)")
        nodes = [{"id": n, "rack": rack} for n in names]
    client = _client(ctx)
    total = {"registered": 0, "already_known": 0}
    for i in range(0, len(nodes), REGISTER_BATCH):
        doc = client.call("POST", "/nodes", {"nodes": nodes[i:i + REGISTER_BATCH], "state": state})
        total = {k: total[k] + int(doc[k]) for k in total}
    _out(total, as_json, lambda d: f"{d['registered']} registered, {d['already_known']} already known")


def _topology_nodes(path: Path, only: list[str]) -> list[dict[str, Any]]:
    """The API's registration of the nodes (or compute trays) of the topology at ``path``, or of ``only``."""
    from gpufleet.domain.topology import load_topology, to_fleet

    fleet = to_fleet(load_topology(path))
    missing = [n for n in only if n not in fleet]
    if missing:
        raise InvalidInput("names", missing, f"nodes of the topology {path} ({len(fleet)} nodes)")
    chosen = [fleet.nodes[n] for n in only] if only else list(fleet)
    if not chosen:
        raise InvalidInput("--topology", str(path), "a topology with at least one node or compute tray")
    return [{"id": n.id, "rack": n.rack, "serial": n.serial, "leaves": sorted(n.leaves),
             "gpus": [{"index": g.index, "serial": g.serial, "sku": g.sku} for g in n.gpus]} for n in chosen]


@fleet_app.command()
def drain(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the node id")], reason: Reason = "",
          as_json: AsJson = False) -> None:
    """Drain a node now (not subject to the breaker)."""
    _operate(ctx, name, "drain", reason, as_json)


@fleet_app.command()
def resume(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the node id")], reason: Reason = "",
           as_json: AsJson = False) -> None:
    """Clear a suspect node, or revalidate a drained / repaired one."""
    _operate(ctx, name, "resume", reason, as_json)


@fleet_app.command("repair-complete")
def repair_complete(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the node id")], reason: Reason = "",
                    as_json: AsJson = False) -> None:
    """A node in repair is fixed: revalidate it before it returns to service."""
    _operate(ctx, name, "repair-complete", reason, as_json)


@fleet_app.command("burn-in")
def burn_in(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the node id")], reason: Reason = "",
            as_json: AsJson = False) -> None:
    """Start the burn-in of a new node (drained, validated, then ready)."""
    _operate(ctx, name, "burn-in", reason, as_json)


@fleet_app.command()
def retire(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the node id")], reason: Reason = "",
           as_json: AsJson = False) -> None:
    """Retire a node for good."""
    _operate(ctx, name, "retire", reason, as_json)


@fleet_app.command()
def approve(ctx: typer.Context,
            names: Annotated[list[str] | None, typer.Argument(help="nodes whose held decisions to carry out")] = None,
            component: Annotated[str, typer.Option(help="approve every node held for this correlated component")]
            = "", as_json: AsJson = False) -> None:
    """Carry out decisions the breaker holds (give nodes, or --component)."""
    if bool(names) == bool(component):
        raise InvalidInput("nodes / --component", names or component or None, "either node names or --component")
    doc = _client(ctx).call("POST", "/held/approve", {"nodes": names or [], "component": component})
    _out(doc, as_json, lambda d: "\n".join(f"{n}: {s}" for n, s in d["states"].items()))


@fleet_app.command()
def cancel(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the node id")], reason: Reason = "",
           as_json: AsJson = False) -> None:
    """Cancel the decision the breaker holds for a node."""
    doc = _client(ctx).call("POST", f"/nodes/{name}/cancel-held", {"reason": reason})
    _out(doc, as_json, lambda d: f"{d['node']}: {d['state']}; cancelled {', '.join(d['cancelled']) or 'nothing'}")


@fleet_app.command()
def breaker(ctx: typer.Context, reset: Annotated[bool, typer.Option(help="reset the breaker")] = False,
            discard_held: Annotated[bool, typer.Option(help="with --reset: cancel the held decisions instead of "
                                                             "re-admitting them")] = False,
            as_json: AsJson = False) -> None:
    """Show the blast-radius breaker, or reset it."""
    if discard_held and not reset:
        raise InvalidInput("--discard-held", True, "only together with --reset")
    client = _client(ctx)
    doc = (client.call("POST", "/breaker/reset", {"discard_held": discard_held}) if reset
           else client.call("GET", "/breaker"))
    def text(b: dict[str, Any]) -> str:
        out = b.get("out_in_scheduler") or []
        return ((f"breaker TRIPPED since {_when(b['since'])}: {b['reason']}" if b["tripped"] else "breaker ok")
                + f"; {b['held']} decision(s) held"
                + (f"; {len(out)} serving node(s) out in the scheduler, counted as out: {', '.join(out)}"
                   if out else ""))

    _out(doc, as_json, text)


@fleet_app.command()
def ttm(ctx: typer.Context,
        share: Annotated[list[float] | None, typer.Option(help="percent of nodes (repeatable; default 50 90 99 "
                                                           "100)")] = None,
        nodes: Annotated[bool, typer.Option(help="list every node's time to market")] = False,
        as_json: AsJson = False) -> None:
    """Time to market: from registration to first ready, per cluster (and per node with --nodes)."""
    doc = _client(ctx).call("GET", "/ttm", share=share, nodes=str(nodes or as_json).lower())

    def hours(s: float | None) -> str:
        return "-" if s is None else f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min"

    def table(d: dict[str, Any]) -> Any:
        rows: list[list[Any]] = [["nodes registered / first ready", f"{d['nodes']} / {d['ready']}"],
                                 ["first registration", _when(d["started"])]]
        rows += [[f"{u['share']:g} % of nodes ready after", hours(u["after_s"])] for u in d["until"]]
        rows += [["burned in", d["burned_in"]], ["median burn-in", hours(d["median_burn_in_s"])],
                 ["failures burn-in found", d["failures_found"]],
                 ["not ready yet", ", ".join(d["not_ready"][:20]) + (" ..." if len(d["not_ready"]) > 20 else "")]]
        t = _table("time to market", ["what", "value"], rows)
        if not d.get("per_node"):
            return t
        from rich.console import Group

        per = _table("per node", ["node", "registered", "first ready", "time to market", "burned in", "failures",
                                  "state"],
                     [[n["node"], _when(n["registered"]), _when(n["first_ready"]), hours(n["ttm_s"]),
                       "yes" if n["burned_in"] else "no", n["failures_found"], n["state"]] for n in d["per_node"]])
        return Group(t, per)

    _out(doc, as_json, table)


@fleet_app.command()
def goodput(ctx: typer.Context,
            since: Annotated[str, typer.Option(help="how far back, e.g. 24h or 7d (at most 366d), or a time "
                                                    "(ISO 8601 with a zone)")] = "24h",
            limit: Annotated[int, typer.Option(help="jobs listed, longest first")] = 20,
            as_json: AsJson = False) -> None:
    """Goodput of the cluster and its jobs over a time range: ETTR, MFU, badput by category."""
    start = since_time(since)
    if limit < 1:
        raise InvalidInput("--limit", limit, "1 or more jobs")
    doc = _client(ctx).call("GET", "/goodput", since=start, limit=min(limit, 1000))

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f} %"

    def table(d: dict[str, Any]) -> Any:
        from rich.console import Group

        c = d["cluster"]
        worst = sorted(((k, v) for k, v in c["badput_s"].items() if v > 0), key=lambda kv: -kv[1])[:3]
        rows = [["range", f"{_when(d['since'])} - {_when(d['until'])}"], ["jobs", d["jobs_total"]],
                ["ETTR", pct(c["ettr"])], ["MFU", pct(c["mfu"])],
                ["GPU-hours (productive / elapsed)", f"{c['productive_s'] / 3600:.1f} / {c['elapsed_s'] / 3600:.1f}"],
                ["largest badput", ", ".join(f"{k} {v / 3600:.1f} GPU-h" for k, v in worst) or "-"]]
        head = _table("goodput of the cluster", ["what", "value"], rows)
        jobs = _table("jobs, longest first", ["job", "ETTR", "MFU", "GPU-hours", "steps"],
                      [[j["job"], pct(j["ettr"]), pct(j["mfu"]), f"{j['elapsed_s'] / 3600:.1f}", f"{j['steps']:g}"]
                       for j in d["jobs"]])
        return Group(head, jobs)

    _out(doc, as_json, table)
