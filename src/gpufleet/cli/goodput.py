"""``gpufleet goodput report RUN_DIR``: a training run's ETTR, MTTF, badput, restarts, MFU and stragglers
from the per-rank logs that :class:`gpufleet.goodput.durable.RunRecorder` wrote; ``push`` sends them to the
controller, ``export`` to MLflow or W&B with the infrastructure events on the job's nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from gpufleet.goodput.runreport import RunReport


def _with_ceiling(r: RunReport, path: Path, dtype: str) -> RunReport:
    """``r`` with the measured GEMM ceiling from a ``gpufleet check --json`` file (errors name the option)."""
    from dataclasses import replace

    from gpufleet.checks.model import measured_gemm_flops
    from gpufleet.domain.errors import InvalidInput

    if r.mfu is None:
        raise InvalidInput("--ceiling", str(path), "a run with an MFU: it declares no FLOPs per step or no peak "
                           "(rec.model(flops_per_step, peak_flops=...))")
    dtype = dtype or r.mfu.dtype
    if not dtype:
        raise InvalidInput("--ceiling-dtype", dtype, "the GEMM to compare with, since the run declared no dtype: "
                           "bf16, fp16, tf32, fp8 or fp32")
    try:
        doc = json.loads(path.read_text("utf-8"))
    except OSError as err:
        raise InvalidInput("--ceiling", str(path), f"a readable file ({err.strerror})") from None
    except ValueError as err:
        raise InvalidInput("--ceiling", str(path), f"the JSON gpufleet check --json prints ({err})") from None
    try:
        flops = measured_gemm_flops(doc, dtype)
    except InvalidInput as err:
        raise InvalidInput(f"--ceiling {path}: {err.field}", err.value, err.expected) from None
    return replace(r, mfu=replace(r.mfu, ceiling_flops=flops))


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
        ceiling: Annotated[Path | None, typer.Option(
            "--ceiling", help="A `gpufleet check --json` report from the run's GPU type: adds MFU against "
                              "its measured GEMM ceiling beside the datasheet peak.")] = None,
        ceiling_dtype: Annotated[str, typer.Option(
            "--ceiling-dtype", help="The GEMM to compare with (bf16, fp16, tf32, fp8, fp32; "
                                    "default: the dtype the run declared).")] = "",
    ) -> None:
        """ETTR, MTTF, badput breakdown, restarts, MFU, stragglers (and TCO) of one run."""
        from gpufleet.goodput.durable import read_run
        from gpufleet.goodput.runreport import render_text, run_report
        from gpufleet.goodput.tco import tco

        r = run_report(read_run(run_dir))
        if ceiling is not None:
            r = _with_ceiling(r, ceiling, ceiling_dtype)
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
                                                help="Controller URL, e.g. http://ctl:8470.")],
        token_file: Annotated[Path, typer.Option(envvar="GPUFLEET_TOKEN_FILE",
                                                 help="File holding the bearer token (agent or operator).")],
        job: Annotated[str, typer.Option(envvar="SLURM_JOB_ID",
                                         help="Job id (default: the one the run log recorded).")] = "",
        run: Annotated[str, typer.Option(help="Run name within the job (default: the run directory's name).")] = "",
    ) -> None:
        """Send the run's final goodput intervals and straggler findings to the controller (one round;
        re-sending is safe). Exit 1 when a post failed or the controller refused a record (422)."""
        from gpufleet.domain.errors import InvalidInput
        from gpufleet.goodput.durable import read_run
        from gpufleet.goodput.push import GoodputPusher

        if not controller.startswith(("http://", "https://")):
            raise InvalidInput("--controller", controller, "an http:// or https:// URL (or $GPUFLEET_CONTROLLER)")
        try:
            token = token_file.read_text("utf-8").strip()
        except OSError as err:
            raise InvalidInput("--token-file", str(token_file), f"a readable token file ({err.strerror})") from None
        # one round by hand: a run directory that cannot be read, or no job to post to, is an error here
        # (the background pusher only logs them and tries again next round)
        logs = read_run(run_dir)
        lead = min(logs, key=lambda lg: lg.rank)
        if not job and not any(a.job for a in lead.attempts):
            raise InvalidInput("--job", job, "the job id the controller knows (or $SLURM_JOB_ID; the run log has none)")
        pusher = GoodputPusher(run_dir, controller, token, job=job, run=run)
        counts = pusher.push_once()
        typer.echo(json.dumps(vars(counts)))
        if counts.failed_posts or counts.refused:
            raise typer.Exit(1)

    @goodput.command("export")
    def export(
        run_dir: Annotated[Path, typer.Argument(help="Directory holding goodput-rank<R>.jsonl files.")],
        mlflow: Annotated[str | None, typer.Option(
            "--mlflow", help="MLflow tracking URI (http://host:5000); needs gpufleet[mlflow].")] = None,
        experiment: Annotated[str, typer.Option(help="MLflow experiment (created when missing).")] = "gpufleet",
        mlflow_run: Annotated[str | None, typer.Option(
            "--mlflow-run", help="Log into this existing MLflow run id instead of a new run.")] = None,
        wandb: Annotated[bool, typer.Option("--wandb", help="Log to Weights & Biases; needs gpufleet[wandb].")] = False,
        project: Annotated[str, typer.Option(help="W&B project.")] = "gpufleet",
        wandb_mode: Annotated[str | None, typer.Option(
            "--wandb-mode", help="online, offline or disabled (default: $WANDB_MODE, else online).")] = None,
        name: Annotated[str | None, typer.Option(help="Run name (default: the run directory's name).")] = None,
        controller: Annotated[str, typer.Option(
            envvar="GPUFLEET_CONTROLLER", help="Controller URL: add the infra events on the job's nodes.")] = "",
        token_file: Annotated[Path | None, typer.Option(
            envvar="GPUFLEET_TOKEN_FILE", help="File holding a bearer token (viewer or above).")] = None,
        job: Annotated[str, typer.Option(help="Job id (default: the one the run log recorded).")] = "",
        node: Annotated[list[str] | None, typer.Option(
            help="The job's nodes (repeat; default: the hosts the run log recorded).")] = None,
        after: Annotated[float, typer.Option(
            help="Also the events up to this many seconds after the run's end (the drain its failure caused, "
                 "the push's last findings).")] = 300.0,
    ) -> None:
        """Log the run's goodput series (ETTR, MFU, badput per interval), totals and the infrastructure
        events on its nodes (drains, XIDs, AER, checkpoint requests, stragglers) to MLflow or W&B."""
        from gpufleet.domain.errors import ExternalError, GpufleetError, InvalidInput
        from gpufleet.goodput.durable import read_run
        from gpufleet.goodput.push import controller_token, fetch_job_events
        from gpufleet.goodput.runreport import run_report
        from gpufleet.goodput.trackers import InfraEvent, TrackerExporter, export_run, merge_events, run_events

        if (mlflow is None) == (not wandb):
            raise InvalidInput("--mlflow/--wandb", f"mlflow={mlflow!r}, wandb={wandb}", "exactly one tracker")
        if wandb_mode is not None and wandb_mode not in ("online", "offline", "disabled"):
            raise InvalidInput("--wandb-mode", wandb_mode, "online, offline or disabled")
        if after < 0:
            raise InvalidInput("--after", after, "seconds >= 0")
        if controller and not controller.startswith(("http://", "https://")):
            raise InvalidInput("--controller", controller, "an http:// or https:// URL (or $GPUFLEET_CONTROLLER)")
        logs = read_run(run_dir)
        r = run_report(logs)
        fetched: list[InfraEvent] = []
        if controller:
            if token_file is None:
                raise InvalidInput("--token-file", None, "a token file for the controller (or $GPUFLEET_TOKEN_FILE)")
            hosts = node or sorted({a.host for lg in logs for a in lg.attempts if a.host})
            lead = min(logs, key=lambda lg: lg.rank)
            since = lead.attempts[0].launched if lead.attempts else None
            if not (job or r.job):
                raise InvalidInput("--job", job, "the job id the controller knows (the run log recorded none)")
            until = (r.intervals[-1].end + after) if r.intervals else None
            try:
                token = controller_token(token_file)
            except InvalidInput as err:
                raise InvalidInput("--token-file", err.value, err.expected) from None
            fetched, cut = fetch_job_events(controller, token, job or r.job, nodes=hosts, since=since, until=until)
            if cut:
                typer.echo("note: the controller listed only the newest 1000 events", err=True)
        events = merge_events(fetched, run_events(r, logs))
        run_name = name or run_dir.resolve().name
        exporter: TrackerExporter
        tracker = "mlflow" if mlflow is not None else "wandb"
        try:
            if mlflow is not None:
                from gpufleet.goodput.mlflow_export import MlflowExporter, probe

                exporter = MlflowExporter(mlflow, run_id=mlflow_run, experiment=experiment, run_name=run_name)
                probe(mlflow)  # a mistyped URI fails now, not after MLflow's minutes of retries
            else:
                from gpufleet.goodput.wandb_export import WandbExporter

                exporter = WandbExporter(project=project, name=run_name, mode=wandb_mode)
            points = export_run(r, exporter, events)
            exporter.close()
        except ImportError as err:  # the extra is not installed: the message names it
            raise InvalidInput(f"--{tracker}", mlflow if mlflow is not None else True,
                               f"the {tracker} package installed ({err})") from None
        except GpufleetError:
            raise
        except Exception as err:  # the tracker's own errors (server down, refused, bad URI): no traceback
            at = f" at {mlflow}" if mlflow is not None else ""
            raise ExternalError(tracker, f"logging to {tracker}{at} failed: {type(err).__name__}: {err}") from None
        where = getattr(exporter, "run_id", None) or getattr(getattr(exporter, "run", None), "id", "")
        typer.echo(json.dumps({"tracker": tracker, "run": where,
                               "points": points, "events": len(events), "ettr": r.goodput.ettr}))
