"""``gpufleet fleet events``: the controller's events, as a table or JSON, or exported as
``gpufleet.event/v1`` lines that ``gpufleet correlate --events`` reads.

The export (``--jsonl``) pages through ``GET /v1/events`` (1,000 a page, newest first; a page that new
events pushed down is read again and its repeats dropped by ``seq``) and prints the events oldest first,
as the controller's correlator saw them: an event merged onto another source's (``fault_of``) is left out,
a ``moved`` event's serial and slots come out of its ``attrs``, a component the agent did not name is its
node. So a window of the fleet's events can be replayed offline against another topology file, budget or
catalog:

    gpufleet fleet events --since 2h --jsonl > window.jsonl
    gpufleet correlate --topology fabric.json --events window.jsonl --false-alarm-budget 1e-2
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.fleet import AsJson, Client, _client, _out, _table, _when, fleet_app, since_time
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.eventio import FileEvent, format_event, parse_time
from gpufleet.domain.events import EventKind, Severity

PAGE = 1000  # the API's largest page


@fleet_app.command()
def events(ctx: typer.Context, node: Annotated[str | None, typer.Option(help="only this node's")] = None,
           kind: Annotated[str | None, typer.Option(help="only this kind, e.g. xid")] = None,
           since: Annotated[str | None, typer.Option(help="only events at or after this: a time (ISO 8601 "
                                                          "with a zone) or how long ago (2h, 30m)")] = None,
           limit: Annotated[int, typer.Option(help="at most this many, newest first (not with --jsonl)")] = 50,
           jsonl: Annotated[bool, typer.Option("--jsonl", help="every matching event, oldest first, as "
                                                               "gpufleet.event/v1 lines (gpufleet correlate "
                                                               "--events)")] = False,
           as_json: AsJson = False) -> None:
    """Recent events, newest first; or every matching event as event lines (--jsonl)."""
    client = _client(ctx)
    after = None if since is None else since_time(since)
    if jsonl:
        if as_json:
            raise InvalidInput("--jsonl", True, "either --jsonl or --json, not both")
        for ev in export(client, node=node, kind=kind, since=after):
            typer.echo(format_event(ev))
        return
    doc = client.call("GET", "/events", node=node, kind=kind, since=after, limit=limit)
    _out(doc, as_json, lambda d: _table(f"{len(d)} event(s)", ["time", "node", "kind", "code", "component",
                                                               "severity", "message"],
                                        [[_when(e["time"]), e["node"], e["kind"], e["code"], e["component"],
                                          e["severity"], e["message"]] for e in d]))


def export(client: Client, *, node: str | None, kind: str | None, since: str | None) -> list[FileEvent]:
    """Every event the controller has that matches, oldest first, as the correlator's input."""
    seen: dict[int, dict[str, Any]] = {}
    offset = 0
    while True:
        page = client.call("GET", "/events", node=node, kind=kind, since=since, limit=PAGE, offset=offset)
        for e in page:
            seen.setdefault(int(e["seq"]), e)
        if len(page) < PAGE:
            break
        offset += PAGE
    kept = sorted((parse_time(e["time"], "time"), seq) for seq, e in seen.items() if not e.get("fault_of"))
    return [file_event(seen[seq], n) for n, (_, seq) in enumerate(kept, start=1)]


def file_event(e: dict[str, Any], line: int) -> FileEvent:
    """One ``GET /v1/events`` entry as a ``gpufleet.event/v1`` event."""
    kind = EventKind(e["kind"])
    attrs = e.get("attrs") or {}
    sev = e.get("severity")
    return FileEvent(
        line, parse_time(e["time"], f"events[{line}].time"), kind,
        component="" if kind is EventKind.MOVED else e.get("component") or e["node"],
        code=e.get("code"), link=e.get("link"),
        serial=attrs.get("serial") if kind is EventKind.MOVED else None,
        from_slot=attrs.get("from") if kind is EventKind.MOVED else None,
        to_slot=attrs.get("to") if kind is EventKind.MOVED else None,
        severity=Severity(sev) if sev else None, message=e.get("message") or "", id=e["id"], node=e["node"])
