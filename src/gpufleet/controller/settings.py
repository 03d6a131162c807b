"""Controller settings: one tree, loaded at the entry point only (TOML file + GPUFLEET_* environment).

Example ``controller.toml``::

    database_url = "sqlite:///gpufleet.db"      # or postgresql://user@host/db
    policy_file = "policy.toml"                # optional; defaults are documented in docs/policy.md
    topology_file = "topology.json"            # optional; enables fault correlation (docs/correlate.md)
    host = "127.0.0.1"
    port = 8470
    reconcile_interval = 1.0                   # seconds between reconciler passes
    scheduler_sync_interval = 0.0              # seconds between reads of the scheduler's node list; 0 = every pass
    scheduler = "slurm"                        # required: "slurm", "kubernetes" or "sim"
    slurm_conf = "/etc/slurm/slurm.conf"        # optional; otherwise the commands' default / $SLURM_CONF
    kubeconfig = "~/.kube/config"              # kubernetes only; in a pod the service account is used
    kube_node_selector = "nvidia.com/gpu.present=true"   # kubernetes only; "" = every node

    checkpoint_signal = ""                     # site-wide checkpoint signal for jobs that declared none; "" = ask
                                               # only jobs that opted in (gpufleet:signal=USR1, docs/slurm.md)
    checkpoint_signal_target = "full"          # slurm: full (batch shell + steps) | batch | steps

    [validation]                                # validation jobs through Slurm (docs/slurm.md); off without command
    command = "gpufleet check --level {level} --node {node} --controller http://ctl:8470 --token-file /etc/gf/tok"
    user = "gpufleet"                          # the reservation's user: the user the controller submits as
    partition = ""                             # optional
    time_limit = "2h"
    # a fabric fault's validation: one job over the node and known-good partners ("" = no pairing)
    pair_command = "srun gpufleet check --level multinode --known-good {partners} --controller http://ctl:8470 ..."
    pair_partners = 1                          # known-good partners the node is paired with

    [repair]                                    # repair executors (docs/lifecycle.md); off by default
    agent = true                               # GPU reset / reboot / fabric-manager restart by the node's agent
    ticket_url = "https://tickets.example/hooks/gpufleet"   # webhook for hardware tickets ("" = audit only)
    ticket_token_file = "/etc/gpufleet/ticket-token"  # optional: a bearer token for the webhook (unset: none)
    bmc_file = "/etc/gpufleet/bmc.toml"         # per-node BMC address + credentials (docs/bmc.md); power-cycle rung
    bmc_ca_bundle = "/etc/gpufleet/bmc-ca.pem"  # the site CA the BMCs' certificates chain to (unset: system store)

    [fleet_judge]                               # fleet-relative outliers among check results (docs/checks.md)
    every = 300                                 # reconciler passes between runs; 0 = off
    window = "24h"                              # how far back check results count
    min_samples = 8                             # smaller (SKU, check) groups are not judged

    [retention]                                 # old events deleted in the background (docs/api.md#retention)
    events = "90d"                              # 0 (default) = keep every event
    archive_dir = "/var/lib/gpufleet/archive"   # optional: events-YYYY-MM-DD.jsonl.gz before deleting

    [[spares.pools]]                            # hot-spare pools per topology domain (docs/spares.md); none by default
    name = "pretrain"
    nodes = "all"                               # all | rack:R | switch:S | nodes:a,b (the pool's nodes)
    per = "switch"                              # the domains spares are kept in: switch (leaf) | rack
    count = 1                                   # spares per domain (or share = 0.05: a fraction of each domain)
    keep_idle = 0                               # spares per domain never lent to the backfill partition
    big_partition = "train"                     # the big job's partition: spares join it when reclaimed
    backfill_partition = "sweep"                # the preemptible partition spares are lent to while idle

    [tls]                                       # optional: HTTPS (docs/api.md#tls)
    certfile = "/etc/gpufleet/tls/server.crt"
    keyfile = "/etc/gpufleet/tls/server.key"
    client_ca = "/etc/gpufleet/tls/agents-ca.crt" # optional: require client certificates signed by it

    [ha]                                        # several replicas on PostgreSQL (docs/scale.md)
    lease_s = 8                                # a dead leader is replaced within lease_s + renew_s
    renew_s = 2                                # at most lease_s / 2
    advertise_url = "http://10.0.0.5:8470"      # "" = from host and port
    forward_certfile = "/etc/gpufleet/tls/forward.crt"   # with [tls] client_ca: the client certificate followers
    forward_keyfile = "/etc/gpufleet/tls/forward.key"    # present to the leader (unset: [tls] certfile/keyfile)

    [limits]                                    # before authentication (docs/api.md#limits)
    max_body_bytes = 67108864
    max_header_bytes = 16384
    read_timeout_s = 30
    header_timeout_s = 10
    ingest_queue_events = 10000                 # queued beyond this: 429 with Retry-After
    max_clock_skew = "5m"                       # checkpoints dated further ahead are refused

    [[tokens]]
    name = "alice"
    role = "operator"
    token_sha256 = "<sha256 hex of the token>"   # or token = "..." (plain, for development only)

    [[tokens]]
    name = "agent-r01"
    role = "agent"
    token = "..."
    nodes = ["r01-*"]                           # the nodes this agent token may report for

    [tenancy]                                   # moving a node between tenants (docs/tenancy.md)
    wipe = "script:reimage"                     # the agent's named script that wipes/reimages the node

    [[tenant]]                                  # a tenant and the node pool it owns (docs/tenancy.md)
    name = "acme"
    nodes = ["r01-*", "r02-n01"]                # glob patterns or node names
    pkey = "0x0a01"                             # optional: its InfiniBand partition key

    [[tokens]]
    name = "acme-ops"
    role = "operator"
    token_sha256 = "<sha256 hex of the token>"
    tenant = "acme"                             # sees and acts on acme's nodes only
"""

from __future__ import annotations

import hashlib
import tomllib
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpufleet.configfile import Seconds, below_environment, invalid_input
from gpufleet.domain.durations import parse_duration
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.tenancy import Tenant, check_static, node_pattern, parse_pkey, tenant_name
from gpufleet.lifecycle.maintenance import Selector
from gpufleet.lifecycle.spares import PoolSpec


class Role(StrEnum):
    VIEWER = "viewer"  # read everything
    AGENT = "agent"  # post events, heartbeats and checkpoints for its nodes
    OPERATOR = "operator"  # viewer + manual actions (drain, resume, retire, dry-run, breaker reset)
    ADMIN = "admin"  # operator + inventory (register nodes)


class SchedulerKind(StrEnum):
    """What the reconciler drives. There is no default: a controller that silently simulated its
    scheduler would drain nothing on a real cluster."""

    SLURM = "slurm"  # scontrol / sinfo / squeue on this host (docs/slurm.md)
    SIM = "sim"  # an in-process simulated scheduler: the demo, trying gpufleet without a cluster
    KUBERNETES = "kubernetes"  # the API server: cordon, taints, conditions, evictions (docs/kubernetes.md)


SCHEDULER_EXPECTED = ('scheduler = "slurm" (drive Slurm through scontrol/sinfo/squeue on this host), '
                      'scheduler = "kubernetes" (drive the Kubernetes API server) or '
                      'scheduler = "sim" (a simulated scheduler) in the controller config, or GPUFLEET_SCHEDULER')


class TokenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)  # who holds the token (the audit log names it)
    role: Role  # viewer, agent, operator or admin (docs/api.md lists what each may do)
    token: str | None = Field(default=None, min_length=16)  # the secret itself: for development only
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")  # its sha256 (gpufleet controller token)
    # Agent tokens: the nodes (glob patterns) it may report for. Required for agents: a token that silently
    # spoke for every node would let one node's agent report (or hide) another's faults. ["*"] says it outright.
    nodes: tuple[str, ...] = ()
    # Viewer/operator tokens: the tenant ([[tenant]] name) whose nodes alone it sees and acts on; none = all
    tenant: str | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> TokenConfig:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token or token_sha256")
        if self.role == Role.AGENT and not self.nodes:
            raise ValueError(f"agent token {self.name!r} needs nodes = [...]: the nodes it may report for "
                             '(globs such as "r01-*"; ["*"] for every node)')
        if self.tenant is not None and self.role not in (Role.VIEWER, Role.OPERATOR):
            raise ValueError(f"token {self.name!r}: tenant applies to viewer and operator tokens only "
                             f"(an {self.role} token is fleet-wide: give it no tenant)")
        return self

    @property
    def digest(self) -> str:
        if self.token_sha256 is not None:
            return self.token_sha256
        assert self.token is not None
        return hashlib.sha256(self.token.encode()).hexdigest()


def _duration(value: object) -> timedelta:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if not isinstance(value, str | int | float):
        raise ValueError("a duration such as 30m, 24h or 7d")
    try:
        td = parse_duration(value)
    except InvalidInput as err:
        raise ValueError(err.expected) from None
    if td <= timedelta(0):
        raise ValueError("a positive duration, e.g. 24h")
    return td


def _duration_or_zero(value: object) -> timedelta:
    """A positive duration, or zero written any way (0, "0", "0s", "0ms": the page shows the default as "0")."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        try:
            if parse_duration(value) == timedelta(0):
                return timedelta(0)
        except InvalidInput:
            pass  # _duration says what was expected
    return _duration(value)


class RetentionSettings(BaseModel):
    """``[retention]``: events received longer ago than ``events`` are deleted by a background thread,
    oldest first, in small transactions (controller.retention; docs/api.md#retention). Off while
    ``events`` is 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    events: Annotated[timedelta, BeforeValidator(_duration_or_zero)] = timedelta(0)  # 0 = keep every event
    archive_dir: Path | None = None  # write them to events-YYYY-MM-DD.jsonl.gz here before deleting them
    batch: int = Field(default=2000, ge=1, le=100_000)  # rows per transaction (ingest waits at most for one)
    interval: Seconds = Field(default=300.0, gt=0)  # seconds between runs (each works off at most 50 batches)
    # diagnostic bundles captured longer ago than this are deleted (0 = keep every bundle; at least 7d)
    bundles: Annotated[timedelta, BeforeValidator(_duration_or_zero)] = timedelta(0)


class FleetJudgeSettings(BaseModel):
    """``[fleet_judge]``: the controller's fleet-relative judging of check results
    (``controller.fleetjudge``; the defaults there are the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    every: int = Field(default=300, ge=0)  # reconciler passes between runs; 0 = off
    window: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(hours=24)  # how far back results count
    min_samples: int = Field(default=8, ge=3)  # smaller (SKU, check) groups are not judged
    threshold: float = Field(default=3.5, gt=0)  # robust z-score (median absolute deviations) of an outlier
    min_rel: float = Field(default=0.05, ge=0, lt=1)  # at least 5 % below the median
    # the checks whose results are compared across the fleet
    checks: tuple[str, ...] = Field(
        default=("gemm_bf16", "gemm_fp16", "gemm_tf32", "gemm_fp8", "gemm_fp32", "hbm_copy"), min_length=1)


class ValidationSettings(BaseModel):
    """``[validation]``: ``gpufleet check`` as Slurm jobs in a maintenance reservation
    (``schedulers.slurm.validation``). Off while ``command`` is empty."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: str = ""  # {node} and {level} are filled in
    user: str = ""  # default: the user the controller runs as
    partition: str = ""  # run validation jobs in this partition ("" = the cluster's default partition)
    # a validation job still running after this is cancelled by Slurm and counts as a failed check
    time_limit: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(hours=2)
    output: str = "/tmp/gpufleet-validate-%j.out"  # the job's stdout/stderr on the node (%j = job id)
    # a fabric fault's validation: one job over the node and known-good partners; {node}, {partners},
    # {nodes} are filled in ("" = no pairing: fabric faults get the single-node check)
    pair_command: str = ""
    pair_partners: int = Field(default=1, ge=1)  # known-good partners the node is paired with


class RepairSettings(BaseModel):
    """``[repair]``: which executors carry out the repair escalation ladder (controller.repairer). With
    none, a node in repair waits for people (``repair-complete``), as before."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    agent: bool = False  # queue GPU reset / reboot / fabric-manager restart for the node's agent
    ticket_url: str = Field(default="", pattern=r"^(https?://\S+)?$")  # "" = tickets are audit lines only
    ticket_token_file: Path | None = None  # file holding a bearer token sent to ticket_url
    ticket_timeout: Seconds = Field(default=10.0, gt=0)  # seconds to wait for the ticket webhook to answer
    # Out-of-band (docs/bmc.md): the BMC of each node, from a secrets file (never this file)
    bmc_file: Path | None = None  # TOML: [nodes.<node>] address, username, password ("file:..."/"env:...")
    bmc_ca_bundle: Path | None = None  # PEM bundle of the site CA for the BMCs' TLS (none: the system store)
    bmc_allow_http: bool = False  # allow http:// BMC addresses (credentials in clear: labs only)
    bmc_timeout: Seconds = Field(default=15.0, gt=0)  # seconds per Redfish request
    bmc_tries: int = Field(default=5, ge=1)  # tries at starting a power cycle before the ladder goes on
    bmc_retry_base: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(seconds=10)  # doubling
    bmc_off_wait: Seconds = Field(default=60.0, gt=0)  # seconds for the BMC to report Off after ForceOff
    sel_interval: Seconds = Field(default=60.0, ge=0)  # seconds between SEL reads of every BMC; 0 = off
    sel_max_age: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(days=1)  # older entries ignored
    firmware_interval: Seconds = Field(default=3600.0, ge=0)  # seconds between firmware inventory reads; 0 = off
    # Diagnostic bundles (docs/bmc.md#diagnostic-bundles): captured by the agent when a node enters repair
    bundle: bool = True  # with agent = true: capture a bundle before the first repair step
    bundle_timeout: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(minutes=10)  # then go on without
    public_url: str = Field(default="", pattern=r"^(https?://\S+)?$")  # the API's URL for ticket links ("" = path)


class SparePoolSettings(BaseModel):
    """One ``[[spares.pools]]``: hot spares kept per topology domain for a big job's partition and lent to
    a preemptible backfill partition while idle (controller.spares; docs/spares.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, max_length=64)  # the pool's name (status, audit)
    nodes: str = "all"  # the pool's nodes: all | rack:R | switch:S | nodes:a,b (registered nodes)
    per: Literal["switch", "rack"] = "switch"  # the topology domains spares are kept in: each leaf switch or rack
    count: int | None = Field(default=None, ge=0)  # spares per domain (give count or share)
    share: float | None = Field(default=None, ge=0, lt=1)  # spares per domain as a fraction of it, rounded up
    keep_idle: int = Field(default=0, ge=0)  # spares per domain kept out of the backfill partition (never lent)
    big_partition: str = Field(min_length=1)  # the big job's partition: spares are out of it until reclaimed
    backfill_partition: str = Field(min_length=1)  # the preemptible partition (PreemptMode=REQUEUE) spares are lent to

    def spec(self) -> PoolSpec:
        return PoolSpec(self.name, self.big_partition, self.backfill_partition, Selector.parse(self.nodes), self.per,
                        self.count, self.share, self.keep_idle)

    @model_validator(mode="after")
    def _valid(self) -> SparePoolSettings:
        try:
            self.spec()
        except InvalidInput as err:
            raise ValueError(f"{err.field} = {err.value!r}: expected {err.expected}") from None
        return self


class SparesSettings(BaseModel):
    """``[spares]``: hot-spare pools (docs/spares.md). Needs ``scheduler = "slurm"``; none by default."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    pools: tuple[SparePoolSettings, ...] = ()  # [[spares.pools]] entries

    @model_validator(mode="after")
    def _unique(self) -> SparesSettings:
        names = [p.name for p in self.pools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pool names must be unique: {', '.join(dup)} appears more than once")
        return self


class TlsSettings(BaseModel):
    """``[tls]``: serve HTTPS. With ``client_ca``, every client must present a certificate signed by it
    (docs/api.md#tls); bearer tokens are still required on top."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    certfile: Path | None = None  # the server's certificate chain (PEM)
    keyfile: Path | None = None  # its private key (PEM)
    client_ca: Path | None = None  # require client certificates signed by this CA (PEM)

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("give both certfile and keyfile, or neither")
        if self.client_ca is not None and self.certfile is None:
            raise ValueError("client_ca needs certfile and keyfile (client certificates need TLS)")
        return self

    @property
    def enabled(self) -> bool:
        return self.certfile is not None


class LimitSettings(BaseModel):
    """``[limits]``: what a request may cost before anyone has checked its token (docs/api.md#limits)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # 413 past this (a batch of 10,000 events fits)
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)  # 431 past this
    read_timeout_s: Seconds = Field(default=30.0, gt=0)  # to receive a request's body, first byte to last
    header_timeout_s: Seconds = Field(default=10.0, gt=0)  # to receive a request's line and headers (408, closed)
    keep_alive_s: Seconds = Field(default=75.0, gt=0)  # an idle connection is closed after this
    ingest_queue_events: int = Field(default=10_000, ge=1)  # queued beyond this: 429 + Retry-After
    # agents' reports refused (429) before their body is read while more requests than this are in flight
    max_inflight_reports: int = Field(default=512, ge=1)
    # a checkpoint dated further ahead of the controller's clock is refused; agents further off are warned about
    max_clock_skew: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(minutes=5)


class TenantConfig(BaseModel):
    """``[[tenant]]``: a tenant and the node pool it owns (docs/tenancy.md). A node moved to another tenant
    (``gpufleet tenancy move``) belongs to the tenant the store records from then on."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str  # lowercase letters, digits, - and _ (tokens name it: tenant = "...")
    nodes: tuple[str, ...] = Field(min_length=1)  # glob patterns ("r01-*") or node names
    pkey: str | None = None  # its InfiniBand partition key, 0x0001..0x7ffe (gpufleet tenancy pkeys)

    def domain(self, i: int) -> Tenant:
        tenant_name(f"tenant[{i}].name", self.name)
        nodes = tuple(node_pattern(f"tenant[{i}].nodes", p) for p in self.nodes)
        pkey = None if self.pkey is None else parse_pkey(f"tenant[{i}].pkey", self.pkey)
        return Tenant(self.name, nodes, pkey)


class TenancySettings(BaseModel):
    """``[tenancy]``: how a node is reprovisioned when it moves to another tenant (docs/tenancy.md):
    drain (checkpoint first) -> ``wipe`` -> validation -> handed over. Moves are refused while ``wipe``
    is empty."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # "script:NAME" (the agents' named script) or "pxe" (boot once from PXE + power cycle through the BMC)
    wipe: str = Field(default="", pattern=r"^(script:[a-z0-9][a-z0-9_-]{0,24}|pxe)?$")
    validation: Literal["full", "quick"] = "full"  # the validation job's level before the handover
    # checkpoint wait + drain: longer than the policy's checkpoint_wait_timeout (2h by default); then it fails
    drain_timeout: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(hours=3)
    wipe_timeout: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(hours=2)  # the script's result
    validate_timeout: Annotated[timedelta, BeforeValidator(_duration)] = timedelta(hours=3)  # its verdict


def check_tenants(tenants: tuple[TenantConfig, ...], tokens: tuple[TokenConfig, ...]) -> tuple[Tenant, ...]:
    """The tenants, checked; InvalidInput names the field (``tenant[1].pkey``), the value and what was expected."""
    out = tuple(t.domain(i) for i, t in enumerate(tenants))
    check_static(out)
    names = {t.name for t in out}
    for i, tok in enumerate(tokens):
        if tok.tenant is not None and tok.tenant not in names:
            raise InvalidInput(f"tokens[{i}].tenant", tok.tenant,
                               f"a tenant of [[tenant]] ({', '.join(sorted(names)) or 'none configured'})")
    return out


class HaSettings(BaseModel):
    """``[ha]``: several replicas on one PostgreSQL (docs/scale.md). On PostgreSQL the replicas elect a
    leader with a lease row; the leader's writes are fenced by the lease's epoch. On SQLite there is one
    replica and no election (these settings are not used)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    lease_s: Seconds = Field(default=8.0, gt=0, le=300)  # a dead leader is replaced within lease_s + renew_s
    renew_s: Seconds = Field(default=2.0, gt=0)  # how often each replica asks for the lease (at most lease_s / 2)
    # where this replica serves the API for the others (followers forward writes to the leader there);
    # "" = http(s)://HOST:PORT from host and port (the host name when host is 0.0.0.0 or ::)
    advertise_url: str = Field(default="", pattern=r"^(https?://\S+)?$")
    forward_timeout_s: Seconds = Field(default=30.0, gt=0)  # a forwarded request waits this long for the leader
    forward_ca: Path | None = None  # https: the CA the leader's certificate chains to (none: the system store)
    forward_tls_name: str = ""  # https: the name in the leader's certificate when the URL is an address ("" = host)
    # with [tls] client_ca: the client certificate (PEM) a follower presents when it forwards to the leader,
    # signed by client_ca and usable for client authentication (docs/scale.md); none = [tls] certfile/keyfile
    forward_certfile: Path | None = None
    forward_keyfile: Path | None = None  # the key of forward_certfile (PEM); both or neither

    @model_validator(mode="after")
    def _renew_twice_a_lease(self) -> HaSettings:
        if self.renew_s * 2 > self.lease_s:
            raise ValueError(f"renew_s ({self.renew_s:g}) must be at most half of lease_s ({self.lease_s:g}): a "
                             "leader renews at least twice per lease, or one slow renewal deposes it")
        if (self.forward_certfile is None) != (self.forward_keyfile is None):
            given, missing = (("forward_certfile", "forward_keyfile") if self.forward_keyfile is None
                              else ("forward_keyfile", "forward_certfile"))
            raise ValueError(f"{given} is set but {missing} is not: give both (the forwarding client certificate "
                             "and its key) or neither")
        return self


class ControllerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="forbid")
    database_url: str = "sqlite:///gpufleet.db"  # SQLAlchemy URL: sqlite:///FILE or postgresql://user@host/db
    policy_file: Path | None = None  # policy.toml (below); none: every default
    topology_file: Path | None = None  # gpufleet.topology/v1: enables fault correlation
    host: str = "127.0.0.1"  # address the API listens on
    port: int = Field(default=8470, ge=0, le=65535)  # port the API listens on (0: any free port)
    reconcile_interval: Seconds = Field(default=1.0, gt=0)  # seconds between reconciler passes
    # Reading every node's state from the scheduler is the reconciler's biggest cost on a large fleet
    # (sinfo --json of 12,500 nodes); actions still run every pass. 0 = read on every pass.
    scheduler_sync_interval: Seconds = Field(default=0.0, ge=0)
    scheduler: SchedulerKind  # required: "slurm", "kubernetes" or "sim" (SCHEDULER_EXPECTED)
    slurm_conf: Path | None = None  # with scheduler = "slurm": the slurm.conf the commands use (SLURM_CONF)
    # with scheduler = "kubernetes": in a pod the service account is used; otherwise this kubeconfig
    kubeconfig: Path | None = None
    kube_context: str | None = None  # the kubeconfig context to use (none: its current context)
    kube_node_selector: str = ""  # label selector of the GPU nodes gpufleet manages ("" = every node)
    kube_watch: bool = True  # read nodes and pods from a watch-fed cache instead of listing every pass
    tokens: tuple[TokenConfig, ...] = ()  # the API's bearer tokens (none: every request is refused)
    # How the controller asks a job to checkpoint before draining its degraded node: jobs opt in by
    # declaring the signal they handle (Slurm: gpufleet:signal=USR1 in the job's comment). This is the
    # site-wide default for the jobs that declared none; "" (default) = never signal those (a job
    # that does not handle the signal would die of it: USR1's default action).
    checkpoint_signal: str = Field(default="", pattern=r"^((SIG)?[A-Z0-9]+)?$")
    # which processes get the signal (scancel --signal --<target>): full = batch shell and every step,
    # batch = the batch shell only (the script forwards it), steps = every step but not the batch shell
    checkpoint_signal_target: Literal["full", "batch", "steps"] = "full"
    validation: ValidationSettings = ValidationSettings()  # see [validation]
    repair: RepairSettings = RepairSettings()  # see [repair]
    fleet_judge: FleetJudgeSettings = FleetJudgeSettings()  # see [fleet_judge]
    retention: RetentionSettings = RetentionSettings()  # see [retention]: old events deleted (or archived)
    spares: SparesSettings = SparesSettings()  # see [spares]: hot-spare pools per topology domain
    tls: TlsSettings = TlsSettings()  # see [tls]: HTTPS, optional client certificates
    limits: LimitSettings = LimitSettings()  # see [limits]: what a request may cost before its token is checked
    tenancy: TenancySettings = TenancySettings()  # see [tenancy]: how a node moves between tenants
    tenant: tuple[TenantConfig, ...] = ()  # [[tenant]]: tenants and the node pools they own (docs/tenancy.md)
    ha: HaSettings = HaSettings()  # see [ha]: leader election and fencing of replicas on PostgreSQL
    api_docs: bool = True  # /docs: Swagger UI, its assets served by the controller itself (no CDN)
    openapi_requires_auth: bool = False  # /openapi.json only for a valid token

    @model_validator(mode="after")
    def _tenants(self) -> ControllerSettings:
        check_tenants(self.tenant, self.tokens)  # InvalidInput (field, value, expected): not wrapped by pydantic
        return self

    @property
    def tenants(self) -> tuple[Tenant, ...]:
        return check_tenants(self.tenant, self.tokens)


def _read(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInput("config", str(path), "an existing TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise InvalidInput("config", str(path), f"valid TOML ({err})") from None


def database_url(path: Path | None = None, override: str | None = None) -> str:
    """The database ``controller serve`` would use with the same config file, environment and
    ``--database-url`` (``controller migrate``): the file is checked as ``serve`` checks it (an unknown
    key, a bad value), but it need not name a scheduler."""
    doc = below_environment(_read(path), "GPUFLEET_")
    if override is not None:
        doc["database_url"] = override
    doc.setdefault("scheduler", SchedulerKind.SIM)  # serve requires one; migrating does not use it
    try:
        return ControllerSettings(**doc).database_url
    except ValidationError as err:
        raise invalid_input(err, ControllerSettings) from None


def load_settings(path: Path | None = None, **overrides: Any) -> ControllerSettings:
    """Settings from ``path`` (TOML), then GPUFLEET_* environment variables, then ``overrides``."""
    doc = below_environment(_read(path), "GPUFLEET_")  # the environment overrides the file
    doc.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ControllerSettings(**doc)
    except ValidationError as err:
        # A misspelt key first: "schedular = ..." should be named as such, not as a missing scheduler.
        bad = invalid_input(err, ControllerSettings)
        if bad.field == "scheduler":
            missing = any(e["type"] == "missing" and tuple(e["loc"]) == ("scheduler",) for e in err.errors())
            value = None if missing else bad.value
            raise InvalidInput("scheduler", value, SCHEDULER_EXPECTED) from None
        raise bad from None
