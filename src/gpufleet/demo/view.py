"""The demo's live Rich view: nodes by state, recent decisions with reasons, the job, the breaker."""

from __future__ import annotations

from collections import Counter

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gpufleet.demo.report import START
from gpufleet.demo.world import World
from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.lifecycle.states import NodeState

_STYLE = {
    NodeState.READY: "green", NodeState.IN_SERVICE: "bright_green", NodeState.SUSPECT: "yellow",
    NodeState.DRAINING: "orange1", NodeState.DRAINED: "red", NodeState.REPAIR: "red3",
    NodeState.REVALIDATE: "cyan", NodeState.BURN_IN: "cyan", NodeState.NEW: "white", NodeState.RETIRED: "grey50",
}


def render(world: World, api: str) -> RenderableType:
    now = world.clock.now()
    elapsed = now - START
    states = {n.id: world.controller.state_of(n.id) for n in world.fleet}
    counts = Counter(states.values())

    head = Text.assemble(
        ("gpufleet demo ", "bold"), (f"sim time +{elapsed.total_seconds() / 3600:5.2f} h of "
                                     f"{world.duration.total_seconds() / 3600:.0f} h   ", ""),
        ("API ", "dim"), (api, "underline"),
    )
    b = world.controller.breaker
    breaker = (Text(f"BREAKER TRIPPED: {b.reason} ({len(world.controller.engine.held)} decisions held)",
                    style="bold red") if b.tripped else Text("breaker: closed", style="green"))

    correlated = Text("\n".join(f"correlated: {c.line()}" for c in world.correlated.values()), style="magenta")

    nodes = Table(title="nodes by state", expand=True, show_edge=False)
    nodes.add_column("state")
    nodes.add_column("#", justify="right")
    nodes.add_column("nodes")
    for st in NodeState:
        if counts.get(st):
            names = [n for n, s in states.items() if s == st]
            shown = "" if st in (NodeState.READY, NodeState.IN_SERVICE) else ", ".join(names[:6])
            shown += " ..." if len(names) > 6 and shown else ""
            nodes.add_row(Text(st.value, style=_STYLE[st]), str(counts[st]), shown)

    # The short columns keep their width; the reason takes what is left (cut with an ellipsis), so an
    # 80-column log (a pipe, CI) still shows whole times, nodes, moves and statuses.
    dec = Table(title="recent decisions", expand=True, show_edge=False)
    for name in ("time", "node", "move", "status"):
        dec.add_column(name, no_wrap=True)
    dec.add_column("reason", overflow="ellipsis", no_wrap=True, ratio=1)
    for d in world.decisions[-9:]:
        style = "yellow" if d.status == DecisionStatus.HELD else ""
        dec.add_row(f"+{(d.time - START).total_seconds() / 3600:4.1f}h", d.node, f"{d.from_state}->{d.to_state}",
                    Text(d.status.value, style=style), d.reason)

    job = world.job
    ettr = job.report(now).ettr
    job_text = Text.assemble(
        ("training job ", "bold"), (f"{job.phase.value} on {len(job.nodes())}/{job.size} nodes   ", ""),
        (f"interruptions {job.interruptions}   ", "yellow" if job.interruptions else ""),
        (f"ETTR so far {ettr:.1%}", "bold green" if ettr >= 0.9 else "bold yellow"),
    )
    log = Text("\n".join(world.log[-5:]), style="dim")
    extra = [correlated] if world.correlated else []
    parts: list[RenderableType] = [head, breaker, *extra, nodes, dec, job_text, log]
    return Panel(Group(*parts), title="gpufleet", border_style="blue")
