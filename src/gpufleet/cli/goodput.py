"""``gpufleet goodput report RUN_DIR``: a training run's ETTR, MTTF, badput, restarts, MFU and stragglers
from the per-rank logs that :class:`gpufleet.goodput.durable.RunRecorder` wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    goodput = typer.Typer(help="Training-side goodput: reports from a run's recorder logs.", no_args_is_help=True)
    app.add_typer(goodput, name="goodput")

    @goodput.command("report")
    def report(
        run_dir: Annotated[Path, typer.Argument(help="Directory holding goodput-rank<R>.jsonl files.")],
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    ) -> None:
        """ETTR, MTTF, badput breakdown, restarts, MFU and stragglers of one run."""
        from gpufleet.goodput.durable import read_run
        from gpufleet.goodput.runreport import render_text, run_report

        r = run_report(read_run(run_dir))
        typer.echo(json.dumps(r.as_dict(), indent=2) if as_json else render_text(r))
