"""``gpufleet demo``: the whole loop on a simulated fleet, no GPU, no network, about a minute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        seed: Annotated[int, typer.Option(help="random seed: the same seed gives the same run")] = 7,
        duration: Annotated[str, typer.Option(help="simulated time, e.g. 12h, 2d")] = "12h",
        nodes: Annotated[int, typer.Option(help="simulated HGX nodes (8 GPUs, 8 rails; 4 to a rack, 32 to a "
                                                "scalable unit)")] = 32,
        wall_seconds: Annotated[float, typer.Option(help="pace the live view to about this many seconds")] = 60.0,
        port: Annotated[int, typer.Option(help="API port on 127.0.0.1 (0 = any free port)")] = 0,
        headless: Annotated[bool, typer.Option(help="no live view; run as fast as possible")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="print the summary as one JSON object")] = False,
        database: Annotated[Path | None, typer.Option(help="keep the SQLite database at this path")] = None,
    ) -> None:
        """Run the controller, with fault correlation, on a simulated 32-node HGX fleet with a training job
        and a realistic fault mix."""
        from rich.console import Console

        from gpufleet.demo.run import DemoOptions, print_summary, run_demo
        from gpufleet.domain.durations import parse_duration

        opts = DemoOptions(seed=seed, duration=parse_duration(duration, "--duration"), nodes=nodes,
                           wall_seconds=wall_seconds, port=port, headless=headless or as_json, database=database)
        console = Console(stderr=True)
        summary = run_demo(opts, console)
        if as_json:
            typer.echo(json.dumps(summary, default=str))
        else:
            print_summary(summary, Console())
