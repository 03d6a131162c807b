"""``gpufleet tenancy``: tenants, moves between them, InfiniBand partition keys (docs/tenancy.md).

``move NODE --to TENANT`` starts a move (drain, wipe, validation, handover) through the controller's
API; ``status`` lists the tenants and the moves. ``pkeys`` prints OpenSM ``partitions.conf`` entries
for the tenants of a controller config, from the topology's nodes and their agents' inventories (the
HCA port GUIDs); with ``--live`` the owners (and, without ``--inventories``, the inventories) come from
the running controller, so nodes moved since the config was written are in their new tenant's
partition. Connection, token, ``--json`` and exit codes as ``gpufleet fleet`` (cli/fleet.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.fleet import AsJson, Reason, _client, _out, _table, _when, api_callback
from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.domain.fleet import ComponentKind
from gpufleet.domain.inventory import NodeInventory, parse_inventory
from gpufleet.domain.partitions import check_grammar, port_guids, render
from gpufleet.domain.topology import load_topology

tenancy_app = typer.Typer(help="Tenants: move a node (reprovisioned), status, InfiniBand partition keys.",
                          no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(tenancy_app, name="tenancy")


api_callback(tenancy_app,
             "Tenants and moves through the controller's API; partition keys from the config and topology.")


@tenancy_app.command()
def move(ctx: typer.Context, node: Annotated[str, typer.Argument(help="the node to move")],
         to: Annotated[str, typer.Option("--to", help="the tenant it moves to")], reason: Reason = "",
         as_json: AsJson = False) -> None:
    """Move NODE to another tenant: drain (checkpoint first), wipe, validation, then handover (admin token)."""
    doc = _client(ctx).call("POST", f"/nodes/{node}/tenant", {"to": to, "reason": reason})
    _out(doc, as_json, lambda d: f"move {d['id']}: {d['node']} {d['from_tenant'] or '(no tenant)'} -> "
         f"{d['to_tenant']}: {d['state']} (rollout {d['rollout']}; the node has no tenant until it is handed over)")


@tenancy_app.command()
def status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """The tenants with their nodes, and the moves (newest first)."""
    from rich.console import Group

    def show(d: dict[str, Any]) -> Any:
        tenants = _table("tenants", ["tenant", "pkey", "nodes"],
                         [[t["name"], t["pkey"] or "", f"{len(t['nodes'])}: {', '.join(t['nodes'][:8])}"]
                          for t in d["tenants"]])
        moves = _table("moves", ["id", "node", "from", "to", "state", "updated", "detail"],
                       [[m["id"], m["node"], m["from_tenant"] or "", m["to_tenant"], m["state"], _when(m["updated"]),
                         m["detail"]] for m in d["moves"]])
        return Group(tenants, moves)

    _out(_client(ctx).call("GET", "/tenancy"), as_json, show)


@tenancy_app.command()
def pkeys(ctx: typer.Context,
          topology: Annotated[Path, typer.Option(help="the topology file (gpufleet.topology/v1): the fabric's nodes")],
          config: Annotated[Path, typer.Option(help="the controller config: its [[tenant]] entries and pkeys")],
          inventories: Annotated[list[Path] | None, typer.Option(
              help="agent inventories (gpufleet agent --print-inventory): a JSON object, a list, or JSON lines; "
                   "repeatable")] = None,
          live: Annotated[bool, typer.Option(help="owners (and inventories, without --inventories) from the "
                                                  "running controller")] = False) -> None:
    """Print OpenSM partitions.conf entries: one partition per tenant, its nodes' port GUIDs full members."""
    from gpufleet.controller.settings import load_settings

    tenants = load_settings(config, scheduler="sim").tenants
    topo = load_topology(topology)
    nodes = sorted(topo.of_kind(ComponentKind.NODE) or topo.of_kind(ComponentKind.COMPUTE_TRAY))
    invs = {i.node: i for p in inventories or [] for i in _read_inventories(p)}
    if live:
        c = _client(ctx)
        owned = {t["name"]: [n for n in t["nodes"] if n in nodes] for t in c.call("GET", "/tenancy")["tenants"]}
        if not inventories:
            for n in nodes:
                try:
                    invs[n] = parse_inventory(c.call("GET", f"/nodes/{n}/inventory"), f"inventory of {n}")
                except NotFound:
                    continue
    else:
        owned = {t.name: [n for n in nodes if t.matches(n)] for t in tenants}
    text = render(tenants, owned, {n: port_guids(i) for n, i in invs.items() if n in nodes},
                  source=f"{topology.name}, {config.name}" + (", the controller's owners" if live else ""))
    problems = check_grammar(text)
    if problems:  # never print a file the subnet manager would refuse
        raise InvalidInput("partitions.conf", problems[0], "entries OpenSM's documented grammar accepts")
    typer.echo(text)


def _read_inventories(path: Path) -> list[NodeInventory]:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InvalidInput("--inventories", str(path), f"a readable file ({err})") from None
    try:
        doc = json.loads(raw)
        docs = doc if isinstance(doc, list) else [doc]
    except ValueError:
        try:
            docs = [json.loads(line) for line in raw.splitlines() if line.strip()]
        except ValueError as err:
            raise InvalidInput("--inventories", str(path), f"JSON: an inventory, a list, or JSON lines ({err})") \
                from None
    return [parse_inventory(d, f"{path.name}[{i}]") for i, d in enumerate(docs)]
