"""``gpufleet slurm``: the hooks Slurm runs on each node (prolog, epilog, HealthCheckProgram) and the
checkpoint signal a job sends. slurm.conf lines: docs/slurm.md."""

from __future__ import annotations

import os
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

slurm_app = typer.Typer(help="Slurm hooks (prolog, epilog, healthcheck, checkpoint) and topology.conf.",
                        no_args_is_help=True)

DEFAULT_STATUS = "/var/lib/gpufleet-agent/node-status.json"  # the agent's default state_dir + node-status.json
DEFAULT_JOURNAL = "/var/lib/gpufleet/slurm-jobs.jsonl"

NodeOpt = Annotated[str | None, typer.Option(help="node name (default: $SLURMD_NODENAME)")]
ConfOpt = Annotated[str | None, typer.Option(help="slurm.conf for scontrol (default: $SLURM_CONF)")]


def register(app: typer.Typer) -> None:
    app.add_typer(slurm_app, name="slurm")


def _node(node: str | None) -> str:
    from gpufleet.domain.errors import InvalidInput

    name = node or os.environ.get("SLURMD_NODENAME", "")
    if not name:
        raise InvalidInput("--node", name, "a node name (or run under slurmd, which sets SLURMD_NODENAME)")
    return name


def _default_check(node: str) -> list[str]:
    exe = Path(sys.executable).with_name("gpufleet")
    return [str(exe) if exe.exists() else "gpufleet", "check", "--level", "quick", "--json", "--node", node]


@slurm_app.command()
def prolog(
    node: NodeOpt = None,
    job_id: Annotated[str | None, typer.Option(help="default: $SLURM_JOB_ID")] = None,
    check_command: Annotated[str | None, typer.Option(
        help="quick check to run (shell words); default: gpufleet check --level quick --json")] = None,
    timeout: Annotated[float, typer.Option(help="seconds before a hung check counts as failed")] = 60.0,
    fail_closed: Annotated[bool, typer.Option(help="refuse the node also when the check cannot run")] = False,
    slurm_conf: ConfOpt = None,
) -> None:
    """Prolog: run the quick check; on failure drain this node with the reason and exit 1."""
    from gpufleet.schedulers.slurm import SlurmScheduler, SubprocessRunner
    from gpufleet.schedulers.slurm.hooks import prolog as run_prolog

    name = _node(node)
    argv = shlex.split(check_command) if check_command else _default_check(name)
    checker = SubprocessRunner()
    out = run_prolog(name, job_id or os.environ.get("SLURM_JOB_ID", ""), argv,
                     lambda a, t: checker(a, timeout=t), SlurmScheduler(slurm_conf=slurm_conf),
                     timeout=timeout, fail_closed=fail_closed)
    typer.echo(out.message, err=True)
    raise typer.Exit(0 if out.ok else 1)


@slurm_app.command()
def epilog(
    node: NodeOpt = None,
    journal: Annotated[Path, typer.Option(help="JSON-lines journal of finished jobs")] = Path(DEFAULT_JOURNAL),
) -> None:
    """Epilog: record the job's end in the local journal. Always exits 0 (a failing epilog drains)."""
    from gpufleet.schedulers.slurm.hooks import epilog as run_epilog

    name = node or os.environ.get("SLURMD_NODENAME", "") or "unknown"
    out = run_epilog(name, os.environ, journal, datetime.now(UTC))
    typer.echo(out.message, err=True)


@slurm_app.command()
def healthcheck(
    node: NodeOpt = None,
    status_file: Annotated[Path, typer.Option(help="the agent's status file (gpufleet.node-status/v1)",
                                              envvar="GPUFLEET_NODE_STATUS")] = Path(DEFAULT_STATUS),
    max_age: Annotated[str, typer.Option(help="ignore a status older than this (agent down)")] = "5m",
    policy: Annotated[Path | None, typer.Option(help="the controller's policy file: judge with its overrides")] = None,
    controller_fresh: Annotated[str, typer.Option(
        help="leave a fatal status to the controller when the agent reached it this recently (0s: always drain)")
    ] = "2m",
    slurm_conf: ConfOpt = None,
) -> None:
    """HealthCheckProgram: drain this node when the agent's local status is fatal and the controller is out
    of reach (exit 1 then)."""
    from gpufleet.domain.durations import parse_duration
    from gpufleet.lifecycle.config import load_policy
    from gpufleet.schedulers.slurm import SlurmScheduler
    from gpufleet.schedulers.slurm.hooks import healthcheck as run_healthcheck

    out = run_healthcheck(_node(node), status_file, SlurmScheduler(slurm_conf=slurm_conf), datetime.now(UTC),
                          parse_duration(max_age, "--max-age"), load_policy(policy).catalog,
                          parse_duration(controller_fresh, "--controller-fresh"))
    if out.message:  # nothing when the node was already drained (slurmd runs this every few seconds)
        typer.echo(out.message, err=True)
    raise typer.Exit(0 if out.ok else 1)


@slurm_app.command("topology-conf")
def topology_conf(
    topology: Annotated[Path, typer.Option(help="gpufleet.topology/v1 file (host ids = Slurm node names)")],
    out: Annotated[Path | None, typer.Option(
        help="write here (atomically, only when it changed) instead of printing; e.g. /etc/slurm/topology.conf")
    ] = None,
    reconfigure: Annotated[bool, typer.Option(
        help="after --out changed the file, run `scontrol reconfigure` so slurmctld reads it")] = False,
    slurm_conf: ConfOpt = None,
) -> None:
    """Slurm's topology.conf (topology/tree) from the topology file: switch blocks for placement."""
    from gpufleet.domain.errors import InvalidInput
    from gpufleet.domain.topology import load_topology
    from gpufleet.files import write_if_changed
    from gpufleet.schedulers.slurm import SlurmScheduler
    from gpufleet.schedulers.slurm.topoconf import topology_conf as render
    from gpufleet.schedulers.slurm.topoconf import tree

    if reconfigure and out is None:
        raise InvalidInput("--reconfigure", True, "--out as well (the file slurmctld reads)")
    topo = load_topology(topology)
    text = render(topo, str(topology))
    if out is None:
        typer.echo(text, nl=False)
        return
    if not out.parent.is_dir():
        raise InvalidInput("--out", str(out), "a path in an existing directory")
    if not write_if_changed(out, text):
        typer.echo(f"{out}: unchanged", err=True)
        return
    typer.echo(f"{out}: written ({len(tree(topo))} switches)", err=True)
    if reconfigure:
        SlurmScheduler(slurm_conf=slurm_conf).reconfigure()
        typer.echo("scontrol reconfigure: slurmctld re-read its configuration", err=True)


@slurm_app.command()
def checkpoint(
    job_id: Annotated[str | None, typer.Option(help="default: $SLURM_JOB_ID")] = None,
    at: Annotated[str | None, typer.Option(help="checkpoint time, ISO-8601 with zone (default: now)")] = None,
    marker: Annotated[Path | None, typer.Option(help="take the time from this marker file's mtime")] = None,
    comment: Annotated[bool, typer.Option(help="set the token in the job's Slurm comment")] = True,
    controller: Annotated[str | None, typer.Option(help="also POST it to this controller URL")] = None,
    token_file: Annotated[Path | None, typer.Option(help="bearer token for --controller")] = None,
    slurm_conf: ConfOpt = None,
) -> None:
    """Report that the job just wrote a checkpoint (job comment token and/or the controller API)."""
    from gpufleet.domain.errors import InvalidInput
    from gpufleet.schedulers.slurm import SlurmScheduler
    from gpufleet.schedulers.slurm.checkpoint import format_time, marker_time

    job = job_id or os.environ.get("SLURM_JOB_ID", "")
    if not job:
        raise InvalidInput("--job-id", job, "a Slurm job id (or run inside the job: SLURM_JOB_ID)")
    if at and marker:
        raise InvalidInput("--at", at, "either --at or --marker, not both")
    if controller and token_file is None:
        raise InvalidInput("--token-file", None, "a token file when --controller is given")
    if marker is not None:
        when = marker_time(marker)
    elif at:
        try:
            when = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput("--at", at, "an ISO-8601 time, e.g. 2026-11-21T12:00:00Z") from None
    else:
        when = datetime.now(UTC)
    stamp = format_time(when)
    if comment:
        SlurmScheduler(slurm_conf=slurm_conf).record_checkpoint(job, when)
    if controller and token_file is not None:
        _post_checkpoint(controller, token_file, job, stamp)
    typer.echo(f"job {job}: checkpoint at {stamp} recorded", err=True)


def _post_checkpoint(controller: str, token_file: Path, job: str, stamp: str) -> None:
    import httpx

    from gpufleet.domain.errors import ExternalError, InvalidInput

    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise InvalidInput("--token-file", str(token_file), "an existing file holding a bearer token") from None
    url = f"{controller.rstrip('/')}/v1/jobs/{job}/checkpoint"
    try:
        resp = httpx.post(url, json={"time": stamp}, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    except httpx.HTTPError as err:
        raise ExternalError("controller", f"POST {url}: {err}") from err
    if resp.status_code >= 300:
        raise ExternalError("controller", f"POST {url}: HTTP {resp.status_code} {resp.text[:200]}",
                            retryable=resp.status_code >= 500)
