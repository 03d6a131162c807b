"""``gpufleet maintenance``: protected rolling maintenance through the controller's API (docs/maintenance.md).

``plan`` creates a rollout (nothing happens yet) and shows its batches; ``start``, ``pause``, ``abort``
drive it; ``status`` shows one (each node's step) or lists them. Connection, token, ``--json`` and exit
codes as ``gpufleet fleet`` (cli/fleet.py).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.fleet import AsJson, Reason, _client, _out, _table, _when, api_callback
from gpufleet.domain.errors import InvalidInput

maintenance_app = typer.Typer(help="Protected rolling maintenance: plan, start, status, pause, abort.",
                              no_args_is_help=True)
Rollout = Annotated[str, typer.Argument(help="the rollout id (from plan)")]


def register(app: typer.Typer) -> None:
    app.add_typer(maintenance_app, name="maintenance")


api_callback(maintenance_app, "Protected rolling maintenance through the controller's API.")


def selector(all_nodes: bool, rack: str | None, switch: str | None, nodes: str | None) -> str:
    """The API's selector from exactly one of --all, --rack, --switch, --nodes."""
    given = [s for s in ("all" if all_nodes else None, rack and f"rack:{rack}", switch and f"switch:{switch}",
                         nodes and f"nodes:{nodes}") if s]
    if len(given) != 1:
        raise InvalidInput("selector", ", ".join(given) or None,
                           "exactly one of --all, --rack R, --switch S, --nodes a,b")
    return given[0]


@maintenance_app.command()
def plan(ctx: typer.Context,
         action: Annotated[str, typer.Option(help="reboot, pxe (boot once from PXE through the node's BMC: a "
                                                  "reimage), or script:NAME (named in the agents' "
                                                  "maintenance_scripts)")],
         all_nodes: Annotated[bool, typer.Option("--all", help="every registered node")] = False,
         rack: Annotated[str | None, typer.Option(help="the nodes of this rack")] = None,
         switch: Annotated[str | None, typer.Option(help="the nodes behind this leaf switch")] = None,
         nodes: Annotated[str | None, typer.Option(help="these nodes (comma-separated)")] = None,
         max_unavailable: Annotated[int | None, typer.Option(
             help="nodes of the fleet out at once, any reason (unset: the controller's default)")] = None,
         max_unavailable_domain: Annotated[int | None, typer.Option(
             help="nodes of one rack/switch out at once (unset: the controller's default)")] = None,
         on_failure: Annotated[str | None, typer.Option(
             help="stop | continue (unset: the controller's default)")] = None,
         validate: Annotated[str | None, typer.Option(
             help="validation before a node returns: full | quick (unset: the controller's default)")] = None,
         action_timeout: Annotated[str | None, typer.Option(help="the agent's result for the action (unset: the "
                                                            "controller's default, docs/maintenance.md)")] = None,
         drain_timeout: Annotated[str | None, typer.Option(help="a node's jobs to leave it (unset: the "
                                                           "controller's default, docs/maintenance.md)")] = None,
         validate_timeout: Annotated[str | None, typer.Option(help="the validation job's verdict (unset: the "
                                                              "controller's default)")] = None,
         as_json: AsJson = False) -> None:
    """Plan a rollout: prints its id and the batches it would run in now. Nothing happens until start. An
    option not given is left to the controller (its defaults: docs/maintenance.md)."""
    body: dict[str, object] = {"selector": selector(all_nodes, rack, switch, nodes), "action": action}
    given = {"max_unavailable": max_unavailable, "max_unavailable_domain": max_unavailable_domain,
             "on_failure": on_failure, "validate": validate, "action_timeout": action_timeout,
             "drain_timeout": drain_timeout, "validate_timeout": validate_timeout}
    body.update({k: v for k, v in given.items() if v is not None})
    _out(_client(ctx).call("POST", "/maintenance", body), as_json, _rollout)


@maintenance_app.command()
def start(ctx: typer.Context, rollout: Rollout, as_json: AsJson = False) -> None:
    """Start a planned rollout, or go on with a paused or stopped one."""
    _out(_client(ctx).call("POST", f"/maintenance/{rollout}/start"), as_json, _rollout)


@maintenance_app.command()
def pause(ctx: typer.Context, rollout: Rollout, reason: Reason = "", as_json: AsJson = False) -> None:
    """Pause: no node starts and no action is sent; nodes past their action finish."""
    _out(_client(ctx).call("POST", f"/maintenance/{rollout}/pause", {"reason": reason}), as_json, _rollout)


@maintenance_app.command()
def abort(ctx: typer.Context, rollout: Rollout, reason: Reason = "", as_json: AsJson = False) -> None:
    """Abort: pending nodes are skipped; nodes drained but not acted on are revalidated and returned."""
    _out(_client(ctx).call("POST", f"/maintenance/{rollout}/abort", {"reason": reason}), as_json, _rollout)


@maintenance_app.command()
def status(ctx: typer.Context, rollout: Annotated[str | None, typer.Argument(help="a rollout id; none: list")] = None,
           as_json: AsJson = False) -> None:
    """One rollout (each node's step, why pending nodes wait), or every rollout."""
    c = _client(ctx)
    if rollout is not None:
        _out(c.call("GET", f"/maintenance/{rollout}"), as_json, _rollout)
        return
    doc = c.call("GET", "/maintenance")
    _out(doc, as_json, lambda d: _table(f"{len(d)} rollout(s)", ["id", "state", "action", "selector", "nodes", "by"],
                                        [[x["id"], x["state"], x["spec"]["action"], x["spec"]["selector"],
                                          ", ".join(f"{n} {s}" for s, n in sorted(x["counts"].items())), x["actor"]]
                                         for x in d]))


def _rollout(d: dict[str, Any]) -> Any:
    from rich.console import Group

    s = d["spec"]
    head = (f"rollout {d['id']}: {d['state']}" + (f" ({d['reason']})" if d["reason"] else "")
            + f" — {s['action']} of {s['selector']}, max_unavailable {s['max_unavailable']}, per domain "
              f"{s['max_unavailable_domain']}, on_failure {s['on_failure']}")
    nodes = _table(head, ["node", "step", "since", "detail"],
                   [[n["node"], n["step"], _when(n["since"]), n["waiting"] or n["detail"]] for n in d["nodes"]])
    batches = _table("batches still to come (if nothing else changes)", ["batch", "nodes"],
                     [[i + 1, ", ".join(b)] for i, b in enumerate(d["batches"])])
    return Group(nodes, batches)
