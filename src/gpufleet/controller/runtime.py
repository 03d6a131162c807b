"""Assembling a running controller: store, engine, reconciler thread and HTTP server.

Used by ``gpufleet controller serve``, by the demo and by the crash tests (which run it in a child
process and kill it with SIGKILL).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from gpufleet.controller import heap
from gpufleet.controller.api.app import create_app
from gpufleet.controller.api.forward import ForwardTls
from gpufleet.controller.api.leaderclient import client_certificate_refusal
from gpufleet.controller.api.limits import Limits
from gpufleet.controller.api.slowclients import admission_protocol
from gpufleet.controller.bmc.credentials import load_targets
from gpufleet.controller.bmc.redfish import RedfishBmc
from gpufleet.controller.bmc.watcher import BmcWatcher
from gpufleet.controller.bundles import Bundles
from gpufleet.controller.clock import Clock, SystemClock
from gpufleet.controller.executors.agent import AgentExecutor
from gpufleet.controller.executors.bmc import BmcExecutor
from gpufleet.controller.executors.port import Executor
from gpufleet.controller.executors.ticket import TicketExecutor
from gpufleet.controller.fleetjudge import FleetJudge
from gpufleet.controller.ha import replica as ha
from gpufleet.controller.ha.elector import Elector, Leadership, always_leading
from gpufleet.controller.ingest import GroupCommitter
from gpufleet.controller.maintenance import Maintenance
from gpufleet.controller.reconciler import Reconciler, Validator
from gpufleet.controller.repairer import Repairer
from gpufleet.controller.retention import Retention, check_horizon
from gpufleet.controller.service import Controller
from gpufleet.controller.settings import ControllerSettings
from gpufleet.controller.spares import PartitionLever, Spares
from gpufleet.controller.store.db import make_engine, migrate
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.controller.store.repo import Store
from gpufleet.controller.tenancy import Tenancy
from gpufleet.correlate import compiled
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.topology import Topology, load_topology
from gpufleet.lifecycle.config import PolicyFile, load_policy
from gpufleet.schedulers.port import Scheduler

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    settings: ControllerSettings
    controller: Controller
    reconciler: Reconciler
    stop: threading.Event = field(default_factory=threading.Event)
    server: uvicorn.Server | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    committer: GroupCommitter | None = None
    retention: Retention | None = None
    bmc: BmcWatcher | None = None  # SEL -> events, firmware inventory ([repair] bmc_file)
    bundles: Bundles | None = None  # diagnostic bundles (uploads, downloads)
    leadership: Leadership = field(default_factory=always_leading)  # leader or follower (controller.ha)
    forward: ForwardTls = field(default_factory=ForwardTls)  # TLS of a follower's requests to the leader
    elector: Elector | None = None  # on PostgreSQL: keeps ``leadership`` true in its own thread
    _when_leading: list[Callable[[], object]] = field(default_factory=list)

    def when_leading(self, work: Callable[[], object]) -> None:
        """Do ``work`` (a write: registering a simulated fleet) now if this replica leads, else once it
        is elected."""
        if self.leadership.leading():
            work()
        else:
            self._when_leading.append(work)

    def on_gain(self, epoch: int) -> None:
        """Elected at ``epoch``: memory from the store, as at a start; then any work waiting for the lead."""
        self.controller.rebuild()
        if self.reconciler.maintenance is not None:
            self.reconciler.maintenance.load()
        self.reconciler.reset()
        while self._when_leading:  # (one that fails stays, and is done at the next election)
            self._when_leading[0]()
            self._when_leading.pop(0)

    def advertise_url(self) -> str:
        """Where this replica serves the API for the others ("" until it listens)."""
        s = self.settings
        if s.ha.advertise_url:
            return s.ha.advertise_url
        if self.server is None or not self.server.started:
            return ""
        host = socket.getfqdn() if s.host in ("0.0.0.0", "::", "") else s.host
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if s.tls.enabled else 'http'}://{host}:{self.bound_port()}"

    def start_elector(self) -> None:
        """The election thread (PostgreSQL; nothing to run on SQLite)."""
        if self.elector is None or any(t.name == "elector" for t in self.threads):
            return
        t = threading.Thread(target=self.elector.run_forever, args=(self.stop,), name="elector", daemon=True)
        t.start()
        self.threads.append(t)

    def start_reconciler(self, interval: float | None = None) -> None:
        """The reconciler thread, and the retention thread when ``[retention] events`` is set; with
        replicas, the election thread (each runs only while this replica leads)."""
        self.start_elector()
        leading = self.leadership.leading
        t = threading.Thread(target=self.reconciler.run_forever,
                             args=(self.stop, interval or self.settings.reconcile_interval),
                             name="reconciler", daemon=True)
        t.start()
        self.threads.append(t)
        rs = self.settings.repair
        if self.bmc is not None and (rs.sel_interval or rs.firmware_interval):
            b = threading.Thread(target=self.bmc.run_forever, name="bmc", daemon=True,
                                 args=(self.stop, rs.sel_interval, rs.firmware_interval, leading))
            b.start()
            self.threads.append(b)
        if self.retention is not None:
            r = threading.Thread(target=self.retention.run_forever, name="retention", daemon=True,
                                 args=(self.stop, self.settings.retention.interval, leading))
            r.start()
            self.threads.append(r)

    def start_api(self, *, in_thread: bool = True, on_started: Callable[[int], None] | None = None) -> None:
        s = self.settings
        lim = s.limits
        app = create_app(self.controller, s.tokens, self.reconciler,
                         limits=Limits(lim.max_body_bytes, lim.max_header_bytes, lim.read_timeout_s),
                         max_queued_events=lim.ingest_queue_events, api_docs=s.api_docs,
                         openapi_requires_auth=s.openapi_requires_auth, retention=self.retention,
                         bmc=self.bmc, bundles=self.bundles, leadership=self.leadership,
                         forward_timeout_s=s.ha.forward_timeout_s,
                         forward_tls=self.forward)
        self.committer = app.state.ingest
        tls: dict[str, Any] = {}
        if s.tls.enabled:
            tls = {"ssl_certfile": str(s.tls.certfile), "ssl_keyfile": str(s.tls.keyfile)}
            if s.tls.client_ca is not None:
                tls |= {"ssl_ca_certs": str(s.tls.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        admission = admission_protocol(lim.header_timeout_s, app.state.refused, lim.max_inflight_reports,
                                       keep_alive_body=lim.max_body_bytes)
        config = uvicorn.Config(app, host=s.host, port=s.port, log_level="warning", access_log=False,
                                lifespan="off", timeout_keep_alive=int(lim.keep_alive_s), http=admission,
                                h11_max_incomplete_event_size=lim.max_header_bytes, **tls)
        self.server = uvicorn.Server(config)
        if not in_thread:
            self.server.run()
            return
        t = threading.Thread(target=self.server.run, name="api", daemon=True)
        t.start()
        self.threads.append(t)
        if on_started is not None:
            while not self.server.started and t.is_alive():
                self.stop.wait(0.02)
            on_started(self.bound_port())

    def bound_port(self) -> int:
        if self.server is None or not self.server.servers:
            return self.settings.port
        sock = self.server.servers[0].sockets[0]
        return int(sock.getsockname()[1])

    def shutdown(self) -> None:
        self.stop.set()
        if self.server is not None:
            self.server.should_exit = True
        for t in self.threads:
            t.join(timeout=5)
        if self.elector is not None:
            self.elector.resign()  # (the thread resigns too when it was started; twice is a no-op)
        if self.committer is not None:
            self.committer.close()


def build(settings: ControllerSettings, scheduler: Scheduler, *, clock: Clock | None = None,
          validator: Validator | None = None, policy: PolicyFile | None = None) -> Runtime:
    engine = make_engine(settings.database_url)
    replicas = ha.elected(engine)
    check_server_tls(settings)  # before anything else: a setting to fix is said at once
    forward = forward_tls(settings, replicas=replicas)
    policy = policy or load_policy(settings.policy_file)  # the files the config names, before the database
    topology = _topology(settings.topology_file)
    if topology is not None:  # which build of the engine runs: a compiled wheel is faster (decision 0109)
        log.info("correlation engine: %s (docs/correlate.md §Compiled engine)", compiled.describe())
    if replicas:
        ha.bound_idle_transactions(engine, settings.ha.lease_s)
    migrate(engine)
    controller = Controller(Store(engine), policy, clock or SystemClock(), topology=topology)
    controller.max_clock_skew = settings.limits.max_clock_skew
    fj = settings.fleet_judge
    judge = FleetJudge(controller, fj.window, fj.min_samples, threshold=fj.threshold, min_rel=fj.min_rel,
                       checks=fj.checks, every=fj.every) if fj.every else None
    node_bmcs = bmcs(settings)
    r = settings.repair
    maintenance = Maintenance(controller, scheduler, BmcExecutor(node_bmcs, off_wait=r.bmc_off_wait) if node_bmcs
                              else None)  # the pxe action (a reimage through the BMC)
    maintenance.load()  # before the first pass: a node a rollout drained is not handed to repair
    tenancy = Tenancy(maintenance, settings.tenants, settings.tenancy)
    tenancy.check()  # the pools against the registered nodes: a pattern matching none, a node in two
    reconciler = Reconciler(controller, scheduler, validator, fleet_judge=judge,
                            sync_interval=settings.scheduler_sync_interval,
                            repairer=repairer(settings, controller, node_bmcs), maintenance=maintenance,
                            tenancy=tenancy, spares=spares(settings, controller, scheduler))
    retention = None
    rs = settings.retention
    if rs.events:
        check_horizon(rs.events, controller.engine.policy.lookback())
    else:
        log.info("retention: every event is kept (set [retention] events to delete old ones)")
    if rs.events or rs.bundles:
        retention = Retention(controller.store, controller.clock, rs.events, batch=rs.batch,
                              archive_dir=rs.archive_dir, bundles=rs.bundles)
    heap.tune()
    heap.settle("start-up")
    watcher = BmcWatcher(controller, node_bmcs, sel_max_age=settings.repair.sel_max_age) if node_bmcs else None
    rt = Runtime(settings, controller, reconciler, retention=retention, bmc=watcher,
                 bundles=Bundles(controller, node_bmcs), forward=forward)
    rt.leadership, rt.elector = ha.join(engine, lease_s=settings.ha.lease_s, renew_s=settings.ha.renew_s,
                                        url=rt.advertise_url, on_gain=rt.on_gain)
    reconciler.leading = rt.leadership.leading
    return rt


def _topology(path: Path | None) -> Topology | None:
    """``topology_file``, loaded; a file that cannot be read is an error naming the setting."""
    if path is None:
        return None
    if not path.is_file():
        raise InvalidInput("topology_file", str(path), "an existing gpufleet.topology/v1 JSON file "
                                                       "(gpufleet topology generate|import; docs/correlate.md)")
    return load_topology(path)


def check_server_tls(settings: ControllerSettings) -> None:
    """``[tls]``'s files load, checked at start-up: a missing file, a certificate that does not match its
    key (or a key that needs a passphrase) or a client_ca that is not PEM is an InvalidInput naming the
    setting, before the database is touched; not a traceback from uvicorn after "controller on https://"."""
    t = settings.tls
    if not t.enabled:
        return
    for name, path in (("tls.certfile", t.certfile), ("tls.keyfile", t.keyfile), ("tls.client_ca", t.client_ca)):
        if path is not None and not path.is_file():
            raise InvalidInput(name, str(path), "an existing, readable PEM file")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:  # a passphrase callback that gives none: an encrypted key is refused, never prompted for
        ctx.load_cert_chain(str(t.certfile), str(t.keyfile), password=lambda: b"")
    except (OSError, ssl.SSLError) as err:
        raise InvalidInput("tls.certfile", str(t.certfile), f"a PEM certificate chain matching tls.keyfile "
                                                            f"({t.keyfile}), an unencrypted PEM key: {err}") from None
    if t.client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(t.client_ca))
        except (OSError, ssl.SSLError) as err:
            raise InvalidInput("tls.client_ca", str(t.client_ca), f"PEM CA certificates: {err}") from None


def forward_tls(settings: ControllerSettings, *, replicas: bool) -> ForwardTls:
    """How this replica's forwarded requests reach the leader over TLS, checked (docs/decisions/0101).

    With ``[tls] client_ca`` the leader asks every client for a certificate signed by it, so a follower
    presents ``[ha] forward_certfile``/``forward_keyfile``, or by default the replica's own ``[tls]``
    certificate. With several replicas (``replicas``: PostgreSQL) that certificate is checked here, at
    start-up, by the same handshake the leader will make: a file that cannot be read, a certificate
    that does not match its key, one not signed by ``client_ca`` or not for client authentication
    (extendedKeyUsage serverAuth only) is an InvalidInput naming the setting — not a 502 at the first
    forwarded report."""
    h, t = settings.ha, settings.tls
    cert: Path | None
    key: Path | None
    if h.forward_certfile is not None:
        cert, key, setting = h.forward_certfile, h.forward_keyfile, "ha.forward_certfile"
        key_setting = "ha.forward_keyfile"
    elif t.client_ca is not None:
        cert, key = t.certfile, t.keyfile
        setting, key_setting = "tls.certfile (the default of ha.forward_certfile)", "tls.keyfile"
    else:
        cert = key = None
        setting, key_setting = "ha.forward_certfile", "ha.forward_keyfile"
    out = ForwardTls(h.forward_ca, h.forward_tls_name, cert, key, setting)
    if not replicas:
        return out  # one replica forwards nothing
    for name, path in (("ha.forward_ca", h.forward_ca), (setting, cert), (key_setting, key)):
        if path is not None and not path.is_file():
            raise InvalidInput(name, str(path), "an existing, readable PEM file")
    if cert is None or key is None:
        return out
    if t.client_ca is None or t.certfile is None or t.keyfile is None:
        try:  # no client_ca here: still a certificate and its key that load
            ssl.create_default_context().load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as err:
            raise InvalidInput(setting, str(cert), f"a PEM certificate matching {key_setting} ({key}): {err}") from None
        return out
    try:
        refusal = client_certificate_refusal(str(cert), str(key), str(t.client_ca), str(t.certfile), str(t.keyfile))
    except (OSError, ssl.SSLError) as err:
        raise InvalidInput(setting, str(cert), f"a PEM certificate matching {key_setting} ({key}) (and a readable "
                                               f"tls.client_ca, tls.certfile and tls.keyfile): {err}") from None
    if refusal is not None:
        raise InvalidInput(setting, str(cert), (
            f"a client certificate the leader accepts: signed by tls.client_ca ({t.client_ca}) and usable for "
            f"client authentication (extendedKeyUsage clientAuth, or no extendedKeyUsage); the leader would "
            f"refuse it ({refusal}) and every forwarded request would fail. Set [ha] forward_certfile and "
            "forward_keyfile to a client certificate signed by client_ca"))
    return out


def spares(settings: ControllerSettings, controller: Controller, scheduler: Scheduler) -> Spares | None:
    """The hot-spare pools ``[spares]`` configures (None: none). They need Slurm's partitions."""
    pools = settings.spares.pools
    if not pools:
        return None
    if not isinstance(scheduler, PartitionLever):
        raise InvalidInput("spares.pools", [p.name for p in pools],
                           'no pools, or scheduler = "slurm": the pools move nodes between Slurm partitions')
    log.info("spares: %d pool(s): %s", len(pools), ", ".join(p.name for p in pools))
    return Spares(controller, scheduler, [p.spec() for p in pools])


def bmcs(settings: ControllerSettings) -> dict[str, RedfishBmc]:
    """A Redfish client per node of ``[repair] bmc_file`` (none without it)."""
    r = settings.repair
    if r.bmc_file is None:
        return {}
    targets = load_targets(r.bmc_file, allow_http=r.bmc_allow_http)
    log.info("BMCs: %d node(s) from %s", len(targets), r.bmc_file)  # the count only: never an address or credential
    return {node: RedfishBmc(t, ca_bundle=r.bmc_ca_bundle, timeout=r.bmc_timeout) for node, t in targets.items()}


def repairer(settings: ControllerSettings, controller: Controller,
             nodes_bmc: Mapping[str, RedfishBmc] | None = None) -> Repairer | None:
    """The repair executors ``[repair]`` configures (None: none, repair stays with people)."""
    r = settings.repair
    executors: dict[str, Executor] = {}
    if r.agent:
        executors["agent"] = AgentExecutor(RepairStore(controller.store), controller.clock)
    if nodes_bmc:
        executors["bmc"] = BmcExecutor(nodes_bmc, off_wait=r.bmc_off_wait)
    if r.ticket_url:
        token = ""
        if r.ticket_token_file is not None:
            try:
                token = r.ticket_token_file.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise InvalidInput("repair.ticket_token_file", str(r.ticket_token_file),
                                   f"a readable file holding the webhook's bearer token ({err.strerror})") from None
        executors["ticket"] = TicketExecutor(r.ticket_url, timeout=r.ticket_timeout, token=token,
                                             public_url=r.public_url)
    if not executors:
        return None
    return Repairer(controller, executors, start_tries=r.bmc_tries, retry_base=r.bmc_retry_base,
                    bundle=r.bundle, bundle_timeout=r.bundle_timeout)
