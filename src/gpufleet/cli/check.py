"""``gpufleet check``: the active validation suite (GEMM, HBM, PCIe, all-reduce, SDC, soak, multi-node).

Exit code 0 when nothing failed, 1 when a check failed, 2 on bad input, 5 when torch, a rendezvous or
the controller failed. torch is imported only when the command runs.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from gpufleet.checks.model import Report

_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def _table(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gpufleet check {report.level} on {report.node} ({report.sku}, {report.device})")
    right = ("gpu/node", "value", "expected", "margin")
    for col in ("check", "gpu/node", "value", "unit", "expected", "margin", "status", "note"):
        table.add_column(col, justify="right" if col in right else "left")
    for r in report.results:
        where = r.node if r.node is not None else ("-" if r.gpu is None else str(r.gpu))
        style = _STATUS_STYLE[str(r.status)]
        table.add_row(
            r.check,
            where,
            f"{r.value:.4g}",
            r.unit,
            "-" if r.expected is None else f"{r.expected:.4g}",
            "-" if r.margin is None else f"{r.margin:+.1%}",
            f"[{style}]{r.status}[/]",
            r.message,
        )
    console = Console()
    console.width = max(console.width, 120)  # a pipe or CI log gets 80 columns by default: too narrow
    console.print(table)
    for s in report.skipped:
        console.print(f"[dim]skipped {s}[/]")
    console.print(
        f"overall: [{_STATUS_STYLE[str(report.status)]}]{report.status}[/] in {report.wall_s:.1f} s"
    )


def register(app: typer.Typer) -> None:
    @app.command()
    def check(
        level: Annotated[
            str, typer.Option(help="quick (<= 60 s), full (<= 10 min), burnin, multinode")
        ] = "quick",
        device: Annotated[str, typer.Option(help="auto, cuda or cpu")] = "auto",
        json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON on stdout")] = False,
        cpu_devices: Annotated[int, typer.Option(help="logical GPUs on the CPU path")] = 2,
        soak: Annotated[str | None, typer.Option(help="soak length, e.g. 10m or 24h (burn-in)")] = None,
        dtypes: Annotated[str | None, typer.Option(help="GEMM dtypes, e.g. bf16,fp8")] = None,
        baselines: Annotated[Path | None, typer.Option(help="per-SKU bars (TOML); default: shipped")] = None,
        node: Annotated[str | None, typer.Option(help="node name (default: host name)")] = None,
        tolerance: Annotated[
            float | None, typer.Option(help="multinode: how far below the best pair a pair may be (0.25)")
        ] = None,
        known_good: Annotated[
            str, typer.Option(help="multinode: comma-separated nodes known to be healthy (never blamed)")
        ] = "",
        controller: Annotated[str | None, typer.Option(help="post results to this controller URL")] = None,
        token_file: Annotated[
            Path | None, typer.Option(help="file holding the controller's bearer token")
        ] = None,
        retry_for: Annotated[
            str,
            typer.Option(help="keep retrying an unreachable controller this long (e.g. 2m; 0s = no retry)"),
        ] = "2m",
    ) -> None:
        """Run the active validation suite on this node (or, with --level multinode, an allocation)."""
        from gpufleet.checks.baselines import load_baselines
        from gpufleet.checks.model import Level, Status
        from gpufleet.domain.durations import parse_duration
        from gpufleet.domain.errors import InvalidInput

        try:
            lvl = Level(level)
        except ValueError:
            raise InvalidInput("--level", level, "quick, full, burnin or multinode") from None
        if device not in ("auto", "cuda", "cpu"):
            raise InvalidInput("--device", device, "auto, cuda or cpu")
        if controller and token_file is None:
            raise InvalidInput("--token-file", None, "a token file when --controller is given")
        if tolerance is not None and not 0 < tolerance < 1:
            raise InvalidInput("--tolerance", tolerance, "a fraction between 0 and 1 (0.25: a pair may be 25 % slower)")
        token = None
        if controller and token_file is not None:  # before minutes of checks, not after them
            from gpufleet.checks.poster import read_token

            if not controller.startswith(("http://", "https://")):
                raise InvalidInput("--controller", controller, "an http:// or https:// URL")
            token = read_token(token_file)
        started = datetime.now(UTC)
        bars = load_baselines(baselines)
        soak_s = None if soak is None else parse_duration(soak, "--soak").total_seconds()
        retry_s = parse_duration(retry_for, "--retry-for").total_seconds()
        if known_good.strip() and lvl is not Level.MULTINODE:
            raise InvalidInput("--known-good", known_good, "only with --level multinode (the partners of a "
                               "fabric check)")
        name = node or socket.gethostname()
        progress = _progress_printer(quiet=json_out and not sys.stderr.isatty())
        rank = 0
        if lvl is Level.MULTINODE:
            from gpufleet.checks.launch import launch_env
            from gpufleet.checks.multinode import run_multinode

            env = launch_env(os.environ, name)
            rank = env.rank
            good = [n.strip() for n in known_good.split(",") if n.strip()]
            report = run_multinode(
                env,
                bars,
                device=device,
                tolerance=tolerance,
                progress=progress if rank == 0 else None,
                known_good=good,
            )
        else:
            from gpufleet.checks.runner import CheckOptions, run_node_checks

            wanted = None if dtypes is None else tuple(d.strip() for d in dtypes.split(",") if d.strip())
            opts = CheckOptions(
                level=lvl, device=device, cpu_devices=cpu_devices, soak_s=soak_s, dtypes=wanted
            )
            report = run_node_checks(opts, bars, name, progress)
        if rank != 0:
            raise typer.Exit(1 if report.status is Status.FAIL else 0)
        if json_out:
            typer.echo(json.dumps(report.to_json(), indent=2))
        else:
            _table(report)
        if controller and token is not None:
            from gpufleet.checks.events import result_to_event
            from gpufleet.checks.poster import post_events

            run_id = f"{started.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"
            events = [
                result_to_event(r, node=report.node, run_id=run_id, time=started, sku=report.sku)
                for r in report.results
            ]
            sent = post_events(controller, token, events, retry_for_s=retry_s)
            typer.echo(f"posted {sent} check events to {controller} (run {run_id})", err=True)
        raise typer.Exit(1 if report.status is Status.FAIL else 0)


def _progress_printer(*, quiet: bool) -> Callable[[str, int, int], None] | None:
    """A progress callback drawing a rich progress bar on stderr (nothing when ``quiet``)."""
    if quiet:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    state: dict[str, TaskID] = {}

    def update(label: str, done: int, total: int) -> None:
        if "task" not in state:
            bar.start()
            state["task"] = bar.add_task(label, total=total)
        bar.update(state["task"], description=label, completed=done, total=total)
        if done >= total:
            bar.stop()

    return update
