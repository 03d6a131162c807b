"""``gpufleet fleet verdicts``: what the controller's correlator blames now, and what it is watching.

A suspect is a component (an NVSwitch chip, a compute tray, a cable, a leaf) the correlator names from
the fleet's events, with the nodes behind it and what it found (``shared``: the part the symptoms have in
common; ``degrading``: weak signals only, drain at the next checkpoint; ``follows_serial`` /
``stays_at_slot``: across a swap). The watch list is the weak patterns close to significance but not
there: nothing acts on them; they show what a few more coincident reports would name
(docs/correlate.md §Watch list).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.fleet import AsJson, _client, _out, _table, _when, fleet_app
from gpufleet.correlate.model import MAX_WATCH_DECADES, WATCH_DECADES


@fleet_app.command()
def verdicts(ctx: typer.Context,
             watch: Annotated[float, typer.Option(min=0, max=MAX_WATCH_DECADES,
                                                  help="list weak patterns within this many decades of "
                                                       "significance (0: none)")] = WATCH_DECADES,
             as_json: AsJson = False) -> None:
    """The correlator's suspects (which switch, tray, cable...) and its watch list."""
    doc = _client(ctx).call("GET", "/verdicts", watch=watch)

    def tables(d: dict[str, Any]) -> Any:
        from rich.console import Group

        suspects = _table(f"{len(d['suspects'])} suspect(s)",
                          ["component", "kind", "confidence", "finding", "action", "nodes", "why"],
                          [[s["component"], s["kind"], f"{s['confidence']:.2f}", s.get("finding", ""),
                            s.get("action", ""), _nodes(s["affected_nodes"]), s.get("reason", "")]
                           for s in d["suspects"]])
        if not watch:
            return suspects
        watched = _table(f"{len(d['watching'])} pattern(s) watched, below significance (nothing acts on them)",
                         ["component", "kind", "decades short", "witnesses", "reporters", "last report"],
                         [[w["component"], w["kind"], f"{w['decades_short']:.2f}", w["witnesses"],
                           ", ".join(w["reporters"]), _when(w["last"])] for w in d["watching"]])
        return Group(suspects, watched)

    _out(doc, as_json, tables)


def _nodes(nodes: list[str]) -> str:
    return ", ".join(nodes[:6]) + (f" (+{len(nodes) - 6})" if len(nodes) > 6 else "")
