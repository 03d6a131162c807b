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
