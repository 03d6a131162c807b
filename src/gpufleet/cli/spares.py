"""``gpufleet spares status``: the hot-spare pools through the controller's API (docs/spares.md).

Per pool and topology domain: the spares it keeps (target), ready (idle), lent (running sweeps in the
backfill partition), being reclaimed and reclaimed (in the big partition in place of a failed node), and
the failed nodes no spare replaces yet. Connection, token, ``--json`` and exit codes as ``gpufleet fleet``.
"""

from __future__ import annotations

from typing import Any

import typer

from gpufleet.cli.fleet import AsJson, _client, _out, _table, _when, api_callback

spares_app = typer.Typer(help="Hot-spare pools per topology domain: status.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(spares_app, name="spares")


api_callback(spares_app, "Hot-spare pools through the controller's API.")


@spares_app.command()
def status(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Per pool and domain: spares kept, ready, lent, reclaiming, reclaimed; failures waiting for a spare."""
    _out(_client(ctx).call("GET", "/spares"), as_json, _pools)


def _pools(doc: list[dict[str, Any]]) -> Any:
    from rich.console import Group

    if not doc:
        from rich.text import Text  # plain text: "[[...]]" is not markup

        return Text("no spare pools: the controller's config has no [[spares.pools]] (docs/spares.md)")
    parts: list[Any] = []
    for p in doc:
        s, t = p["spec"], p["totals"]
        size = f"count {s['count']}" if s["count"] is not None else f"share {s['share']}"
        head = (f"pool {p['pool']}: {s['nodes']} per {s['per']}, {size}, keep_idle {s['keep_idle']}, "
                f"{s['big_partition']} <- {s['backfill_partition']} — {t['ready']} ready, {t['lent']} lent, "
                f"{t['reclaiming']} reclaiming, {t['reclaimed']} reclaimed of {t['target']}"
                + (f" ({p['note']})" if p["note"] else ""))
        parts.append(_table(head, ["domain", "target", "ready", "lent", "reclaiming", "reclaimed"],
                            [[d["domain"], d["target"], d["ready"], d["lent"], d["reclaiming"], d["reclaimed"]]
                             for d in p["domains"]]))
        if p["nodes"]:
            parts.append(_table("nodes held", ["node", "role", "replaces", "step", "since"],
                                [[n["node"], n["role"], n["replaces"], n["step"], _when(n["since"])]
                                 for n in p["nodes"]]))
        if p["waiting"]:
            parts.append(_table("failed, no spare yet", ["node", "why"], [[k, v] for k, v in p["waiting"].items()]))
    return Group(*parts)
