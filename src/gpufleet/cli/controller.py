"""``gpufleet controller``: serve the API and the reconciler; migrate the database; make tokens."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpufleet.cli.errors import configure_logging

if TYPE_CHECKING:
    from gpufleet.controller.kubesync import GpuNodeSync
    from gpufleet.controller.service import Controller
    from gpufleet.controller.settings import ControllerSettings
    from gpufleet.domain.fleet import Fleet
    from gpufleet.schedulers.port import Scheduler
    from gpufleet.schedulers.slurm.validation import SlurmValidator

controller_app = typer.Typer(help="Run and administer the gpufleet controller.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(controller_app, name="controller")


@controller_app.command()
def serve(
    config: Annotated[Path | None, typer.Option(help="controller TOML (database_url, tokens, policy_file...)")] = None,
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL; overrides the config")] = None,
    host: Annotated[str | None, typer.Option(help="address to listen on; overrides the config (default 127.0.0.1)")]
    = None,
    port: Annotated[int | None, typer.Option(help="port to listen on; overrides the config (default 8470)")] = None,
    policy: Annotated[Path | None, typer.Option(help="policy TOML (thresholds, budgets, overrides)")] = None,
    sim_nodes: Annotated[int, typer.Option(min=0, help="with the sim scheduler: register this many simulated "
                                                      "nodes")] = 0,
    sim_state: Annotated[Path | None, typer.Option(help="persist the sim scheduler's state to this file")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
) -> None:
    """Serve the HTTP API and run the reconciler until interrupted.

    The config must say which scheduler to drive (scheduler = "slurm", "kubernetes" or "sim", or
    GPUFLEET_SCHEDULER); there is no default. The first line on stderr says which one it drives.
    Every key of the config: docs/configuration.md."""
    from gpufleet.controller.runtime import build
    from gpufleet.controller.settings import load_settings

    configure_logging(log_level)
    settings = load_settings(config, database_url=database_url, host=host, port=port, policy_file=policy)
    scheduler, fleet, driving = _scheduler(settings, sim_nodes, sim_state)
    typer.echo(f"gpufleet controller: driving {driving}", err=True)
    _port_free(settings.host, settings.port)  # before migrating: a second serve must change nothing
    if settings.port == 0:  # "any free port": pick it now, so what is printed (and advertised) is the real one
        settings = settings.model_copy(update={"port": _any_free_port(settings.host)})
    rt = build(settings, scheduler, validator=_validator(settings, scheduler))
    if fleet is not None:  # a write: on the leader (now, or once this replica is elected)
        rt.when_leading(lambda: rt.controller.register_fleet(fleet))
    if scheduler.name == "kubernetes":
        sync = gpunode_sync(rt.controller, scheduler)
        rt.reconciler.on_pass.append(sync.run_pass)
        rt.reconciler.on_action.append(sync.on_action)
    if not settings.tokens:
        typer.echo("warning: no tokens configured: every /v1 request will be refused (see docs/api.md)", err=True)
    if fleet is None and scheduler.name != "kubernetes" and rt.controller.store.node_count() == 0:
        typer.echo("warning: no nodes registered: agents are refused until an admin runs `gpufleet fleet register "
                   "--topology FILE` (or `register NAMES --rack RACK`)", err=True)
    rt.start_reconciler()
    scheme = "https" if settings.tls.enabled else "http"
    typer.echo(f"gpufleet controller on {scheme}://{settings.host}:{settings.port}/v1 (docs at /docs)", err=True)
    try:
        rt.start_api(in_thread=False)
    finally:
        rt.shutdown()


def _any_free_port(host: str) -> int:
    """A port the system picks as free on ``host`` now (released at once: uvicorn binds it right after)."""
    import socket

    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> None:
    """InvalidInput naming the port when something already listens on ``host:port``."""
    import socket

    from gpufleet.domain.errors import InvalidInput

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        raise InvalidInput("host", host, f"an address this machine can listen on ({err})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as err:
            raise InvalidInput("port", port, f"a port free on {host} ({err.strerror}: is another controller "
                               "running there?)") from None


def _scheduler(settings: ControllerSettings, sim_nodes: int,
               sim_state: Path | None) -> tuple[Scheduler, Fleet | None, str]:
    """The scheduler the config names, the simulated fleet to register (sim only) and, in words, what
    the controller drives."""
    from gpufleet.controller.settings import SchedulerKind
    from gpufleet.domain.errors import InvalidInput

    if settings.scheduler == SchedulerKind.SLURM:
        from gpufleet.schedulers.slurm import SlurmScheduler

        if sim_nodes or sim_state is not None:
            raise InvalidInput("--sim-nodes" if sim_nodes else "--sim-state", sim_nodes or str(sim_state),
                               'nothing with scheduler = "slurm" (the simulated scheduler\'s options)')
        conf = str(settings.slurm_conf) if settings.slurm_conf else None
        where = conf or os.environ.get("SLURM_CONF") or "the commands' default"
        slurm = SlurmScheduler(slurm_conf=conf, checkpoint_signal=settings.checkpoint_signal,
                               checkpoint_target=settings.checkpoint_signal_target)
        return slurm, None, f"Slurm via scontrol/sinfo/squeue (SLURM_CONF={where})"
    if settings.scheduler == SchedulerKind.KUBERNETES:
        return _kubernetes(settings, sim_nodes, sim_state)
    from gpufleet.domain.fleet import simulated_fleet
    from gpufleet.schedulers.sim import SimScheduler

    fleet = simulated_fleet(sim_nodes, max(1, min(4, sim_nodes))) if sim_nodes else None
    sched = SimScheduler([n.id for n in fleet] if fleet else [], state_file=sim_state,
                         checkpoint_signal=settings.checkpoint_signal.removeprefix("SIG"))
    state = f", state in {sim_state}" if sim_state is not None else ""
    return sched, fleet, f"the simulated scheduler ({len(sched.list_nodes())} nodes{state})"


def _kubernetes(settings: ControllerSettings, sim_nodes: int,
                sim_state: Path | None) -> tuple[Scheduler, Fleet | None, str]:
    from gpufleet.domain.errors import InvalidInput

    if sim_nodes or sim_state is not None:
        raise InvalidInput("--sim-nodes" if sim_nodes else "--sim-state", sim_nodes or str(sim_state),
                           'nothing with scheduler = "kubernetes" (the simulated scheduler\'s options)')
    try:
        from gpufleet.schedulers.kubernetes import KubernetesScheduler
        from gpufleet.schedulers.kubernetes.watch import ClusterCache
    except ImportError as err:
        raise InvalidInput("scheduler", "kubernetes",
                           "the kubernetes client installed: pip install 'gpufleet[kubernetes]'") from err
    sched = KubernetesScheduler.connect(
        kubeconfig=str(settings.kubeconfig.expanduser()) if settings.kubeconfig else None,
        context=settings.kube_context, node_selector=settings.kube_node_selector,
        checkpoint_signal=settings.checkpoint_signal)
    if settings.kube_watch:
        sched.cache = ClusterCache(sched.api, node_selector=settings.kube_node_selector).start()
    where = settings.kubeconfig or ("the service account" if not settings.kube_context else settings.kube_context)
    return sched, None, f"Kubernetes at {sched.api.configuration.host} ({where})"


def gpunode_sync(controller: Controller, scheduler: Scheduler) -> GpuNodeSync:
    """The controller's GPUNode resources on the Kubernetes adapter (controller/kubesync.py): this is
    where the controller's views meet the CRD's types, so neither side imports the other."""
    from gpufleet.controller.kubesync import GpuNodeSync, NodeView, RemediationView
    from gpufleet.lifecycle.decisions import ActionKind
    from gpufleet.schedulers.kubernetes import KubernetesScheduler
    from gpufleet.schedulers.kubernetes.crd import (
        GPUNodeStatus,
        RemediationPhase,
        RemediationSpec,
        RemediationStatus,
        VerdictView,
    )
    from gpufleet.schedulers.kubernetes.gpunodes import GpuNodes

    assert isinstance(scheduler, KubernetesScheduler)
    resources = GpuNodes(scheduler)

    def status(v: NodeView) -> GPUNodeStatus:
        return GPUNodeStatus(state=v.state, since=v.since, reason=v.reason, evidence=v.evidence,
                             verdicts=tuple(VerdictView(x.component, x.kind, x.confidence, x.action)
                                            for x in v.verdicts))

    def remediation(r: RemediationView) -> None:
        resources.record(r.action_id,
                         RemediationSpec(r.node, ActionKind(r.kind), r.decision, r.reason, r.requested_at),
                         RemediationStatus(RemediationPhase(r.phase), r.attempts, r.last_error, r.result,
                                           r.finished_at))

    return GpuNodeSync(controller, lambda views: resources.publish({n: status(v) for n, v in views.items()}),
                       resources.maintenance, remediation, scheduler.set_condition)


def _validator(settings: ControllerSettings, scheduler: Scheduler) -> SlurmValidator | None:
    """Validation jobs through Slurm when ``[validation] command`` is set (docs/slurm.md)."""
    import getpass

    from gpufleet.domain.errors import InvalidInput
    from gpufleet.schedulers.slurm import SlurmScheduler
    from gpufleet.schedulers.slurm.validation import SlurmValidator, ValidationJobs

    v = settings.validation
    if not v.command:
        return None
    if not isinstance(scheduler, SlurmScheduler):
        raise InvalidInput("validation.command", v.command, 'nothing unless scheduler = "slurm"')
    jobs = ValidationJobs(v.command, v.user or getpass.getuser(), v.partition, v.time_limit, v.output,
                          v.pair_command, v.pair_partners)
    conf = str(settings.slurm_conf) if settings.slurm_conf else None
    return SlurmValidator(scheduler, jobs, slurm_conf=conf)


@controller_app.command()
def migrate(
    config: Annotated[Path | None, typer.Option(help="controller TOML: its database_url")] = None,
    database_url: Annotated[str | None, typer.Option(help="SQLAlchemy URL; overrides the config and "
                                                           "GPUFLEET_DATABASE_URL")] = None,
) -> None:
    """Create or upgrade the database schema of the database `controller serve` would use with the same
    --config, GPUFLEET_DATABASE_URL and --database-url (serve also does it at start)."""
    from gpufleet.controller.settings import database_url as database_url_of
    from gpufleet.controller.store.db import make_engine
    from gpufleet.controller.store.db import migrate as do_migrate

    engine = make_engine(database_url_of(config, database_url))
    before, after = do_migrate(engine)
    where = engine.url.render_as_string(hide_password=True)
    if before == after:
        typer.echo(f"schema of {where} is at the newest revision ({after}): nothing to do")
    else:
        typer.echo(f"schema of {where} upgraded {before or 'none (created)'} -> {after}")


@controller_app.command()
def token(name: Annotated[str, typer.Argument(help="who the token is for")],
          role: Annotated[str, typer.Option(help="viewer | agent | operator | admin")] = "viewer") -> None:
    """Print a new random token and the [[tokens]] entry (with its sha256) for controller.toml."""
    import hashlib

    from gpufleet.controller.settings import Role
    from gpufleet.domain.errors import InvalidInput

    if role not in {r.value for r in Role}:
        raise InvalidInput("role", role, f"one of {[r.value for r in Role]}")
    secret = secrets.token_urlsafe(32)
    typer.echo(f"token (give this to {name}; it is not stored): {secret}")
    digest = hashlib.sha256(secret.encode()).hexdigest()
    typer.echo(f'\n[[tokens]]\nname = "{name}"\nrole = "{role}"\ntoken_sha256 = "{digest}"')
    if role == Role.AGENT:  # required for agents (settings.TokenConfig): name its nodes before use
        typer.echo('nodes = ["*"]                 # narrow to the nodes this agent reports for, e.g. ["r01-*"]')
