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
        html: Annotated[Path | None, typer.Option(
            "--html", help="Also write a self-contained HTML report with charts here (needs matplotlib).")] = None,
        price: Annotated[float | None, typer.Option(
            "--price-per-gpu-hour", help="TCO: what a GPU-hour costs; adds the price of a useful GPU-hour.")] = None,
    ) -> None:
        """ETTR, MTTF, badput breakdown, restarts, MFU, stragglers (and TCO) of one run."""
        from gpufleet.goodput.durable import read_run
        from gpufleet.goodput.runreport import render_text, run_report
        from gpufleet.goodput.tco import tco

        r = run_report(read_run(run_dir))
        cost = None if price is None else tco(price, max(r.world, 1), r.goodput.elapsed, r.goodput.ettr,
                                              r.mfu.training if r.mfu is not None else None)
        if html is not None:
            from gpufleet.goodput.htmlreport import write_html

            write_html(html, r, cost, str(run_dir))
        if as_json:
            doc = r.as_dict()
            if cost is not None:
                doc["tco"] = cost.as_dict()
            typer.echo(json.dumps(doc, indent=2))
            return
        typer.echo(render_text(r, cost))
        if html is not None:
            typer.echo(f"html report: {html}")

    @goodput.command("push")
    def push(
        run_dir: Annotated[Path, typer.Argument(help="Directory holding goodput-rank<R>.jsonl files.")],
        controller: Annotated[str, typer.Option(envvar="GPUFLEET_CONTROLLER",
                                                help="Controller URL, e.g. http://ctl:8080.")],
        token_file: Annotated[Path, typer.Option(envvar="GPUFLEET_TOKEN_FILE",
                                                 help="File holding the bearer token (agent or operator).")],
        job: Annotated[str, typer.Option(envvar="SLURM_JOB_ID",
                                         help="Job id (default: the one the run log recorded).")] = "",
        run: Annotated[str, typer.Option(help="Run name within the job (default: the run directory's name).")] = "",
    ) -> None:
        """Send the run's final goodput intervals and straggler findings to the controller (one round;
        re-sending is safe). Exit 1 when a post failed."""
        from gpufleet.domain.errors import InvalidInput
        from gpufleet.goodput.push import GoodputPusher

        try:
            token = token_file.read_text("utf-8").strip()
        except OSError as err:
            raise InvalidInput("--token-file", str(token_file), f"a readable token file ({err.strerror})") from None
        pusher = GoodputPusher(run_dir, controller, token, job=job, run=run)
        counts = pusher.push_once()
        typer.echo(json.dumps(vars(counts)))
        if counts.failed_posts:
            raise typer.Exit(1)
