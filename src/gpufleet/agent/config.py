"""Agent configuration: one pydantic model (the edge), loaded from TOML and ``GPUFLEET_AGENT_*`` env vars,
then overridden by command-line options. Everything inside the agent gets plain values from it.

Example ``/etc/gpufleet/agent.toml``::

    node = "r01-n003"
    device = "nvml"
    controller = "https://gpufleet.example:8443"
    token_file = "/etc/gpufleet/node-token"
    state_dir = "/var/lib/gpufleet-agent"
    [cadence]
    fast_s = 1
    slow_s = 30
    [mounts]
    data = "/data"
    checkpoint = "/checkpoints"
    [thresholds]
    ib_expected_rate_gbps = 400
"""

from __future__ import annotations

import re
import socket
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpufleet.agent.rules import Thresholds
from gpufleet.agent.runner import Cadence
from gpufleet.configfile import Seconds, below_environment, invalid_input
from gpufleet.domain.errors import InvalidInput
from gpufleet.lifecycle.maintenance import SCRIPT_NAME


def _defaults(cls: type) -> dict[str, Any]:
    """A dataclass's field defaults: the one place they are written (the models below refer to them)."""
    return {f.name: f.default for f in fields(cls)}


_C = _defaults(Cadence)
_T = _defaults(Thresholds)


class CadenceModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fast_s: Seconds = Field(_C["fast_s"], gt=0)
    slow_s: Seconds = Field(_C["slow_s"], gt=0)
    ib_s: Seconds = Field(_C["ib_s"], gt=0)
    host_s: Seconds = Field(_C["host_s"], gt=0)

    def build(self) -> Cadence:
        return Cadence(self.fast_s, self.slow_s, self.ib_s, self.host_s)


class ThresholdsModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # A GPU's limits in °C: below 40 every idle GPU would report an excursion (a drill had -5 accepted).
    thermal_c: float = Field(_T["thermal_c"], ge=40, le=150)
    thermal_clear_c: float = Field(_T["thermal_clear_c"], ge=30, le=150)
    hbm_thermal_c: float = Field(_T["hbm_thermal_c"], ge=40, le=150)
    sbe_increase: int = Field(_T["sbe_increase"], ge=1)
    dbe_increase: int = Field(_T["dbe_increase"], ge=1)
    retired_pages_max: int = Field(_T["retired_pages_max"], ge=1)
    pcie_replay_increase: int = Field(_T["pcie_replay_increase"], ge=1)
    pcie_gen_min_util: float = Field(_T["pcie_gen_min_util"], ge=0, le=100)
    nvlink_error_increase: int = Field(_T["nvlink_error_increase"], ge=1)
    ib_window_s: Seconds = Field(_T["ib_window_s"], gt=0)
    ib_symbol_error_per_min: float = Field(_T["ib_symbol_error_per_min"], ge=0)
    ib_rcv_error_per_min: float = Field(_T["ib_rcv_error_per_min"], ge=0)
    ib_expected_rate_gbps: float | None = Field(_T["ib_expected_rate_gbps"], gt=0)
    edac_ue_increase: int = Field(_T["edac_ue_increase"], ge=1)
    mount_min_free_fraction: float = Field(_T["mount_min_free_fraction"], ge=0, le=1)
    weak_link_events: StrictBool = _T["weak_link_events"]
    weak_link_interval_s: Seconds = Field(_T["weak_link_interval_s"], ge=1, le=3600)

    @field_validator("thermal_clear_c")
    @classmethod
    def _below_thermal(cls, v: float, info: ValidationInfo) -> float:
        limit = info.data.get("thermal_c")
        if limit is not None and v > limit:  # between the two the rule re-arms and fires again every fast tick
            raise ValueError(f"a temperature at most thermal_c ({limit:g}): the thermal rule re-arms below it")
        return v

    def build(self) -> Thresholds:
        return Thresholds(**self.model_dump())


class AgentConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_AGENT_", extra="forbid")

    node: str = Field(default_factory=socket.gethostname, min_length=1)  # the node's name as the scheduler knows it
    device: Literal["nvml", "sim"] = "nvml"  # nvml: the GPUs through NVML; sim: simulated GPUs (no GPU needed)
    gpus: int = Field(8, ge=0, le=64)  # simulated GPUs (device = "sim")
    sim_seed: int = 0  # seed of the simulated device's readings and serial numbers
    sim_nics: int | None = Field(None, ge=0, le=64)  # simulated InfiniBand HCAs; None = one per GPU
    sim_serial_prefix: str | None = Field(None, min_length=1)  # None = derived from node and seed
    sim_gpu_serials: list[str] = Field(default_factory=list)  # per-GPU overrides ("" keeps the default)
    # simulated slots whose unit does not enumerate, as after a reboot without it ("gpu3", "nic2"): the
    # later units keep their PCI addresses and are numbered one lower (docs/agent.md, Simulated device)
    sim_absent: list[str] = Field(default_factory=list)
    inject: list[str] = Field(default_factory=list)  # simulated faults (device = "sim"), agent/devices/simfaults.py
    controller: str | None = None  # the controller's base URL (http[s]://host:8470); none: events stay local
    token_file: Path | None = None  # file holding the agent's bearer token (an agent-role token naming this node)
    # TLS to an https:// controller (agent/tls.py, docs/api.md#tls)
    ca_file: Path | None = None  # PEM bundle of the CA that signed the controller's certificate (unset: system store)
    client_cert: Path | None = None  # this node's client certificate (PEM), when the controller has [tls] client_ca
    client_key: Path | None = None  # the key of client_cert (PEM); both or neither
    push: bool = True  # send events to the controller (false: expose metrics and write the status file only)
    push_batch: int = Field(500, ge=1, le=10_000)  # events per POST /v1/events
    heartbeat_s: Seconds = Field(30.0, gt=0)  # seconds between heartbeats (the controller's liveness signal)
    push_backoff_base_s: Seconds = Field(1.0, gt=0)  # first retry delay after a failed push; doubles per failure
    push_backoff_cap_s: Seconds = Field(60.0, gt=0)  # longest retry delay (a 429's Retry-After is honoured)
    metrics_port: int = Field(9400, ge=0, le=65535)  # Prometheus /metrics port (0: any free port, logged)
    metrics_addr: str = "0.0.0.0"  # address the metrics endpoint listens on
    state_dir: Path = Path("/var/lib/gpufleet-agent")  # spool, command journal, status file, kernel-log position
    # events kept while the controller is unreachable; when full the oldest non-fatal go first (counted)
    spool_max_events: int = Field(100_000, ge=1)
    ib_root: Path | None = None  # None: /sys/class/infiniband, or the simulated tree with device = "sim"
    sys_root: Path = Path("/sys")  # where sysfs is (EDAC, PCI); another root for containers or tests
    proc_root: Path = Path("/proc")  # where procfs is (boot time for kernel-log stamps)
    kmsg_path: Path = Path("/dev/kmsg")  # the kernel log followed for XID/SXID/host lines
    kmsg: bool = True  # read the kernel log at all (false: NVML XIDs only)
    kmsg_file: Path | None = None  # replay this recorded kernel log instead of following kmsg_path
    # `nvidia-smi nvlink -R` captured at boot: names the GPU on the far end of an SXid's switch port
    nvlink_remote_file: Path | None = None
    # without nvlink_remote_file (device "nvml"): run this at start and use its output (empty: don't)
    nvlink_remote_command: list[str] = Field(default_factory=lambda: ["nvidia-smi", "nvlink", "-R"])
    # role -> path of a mount to watch for presence and free space, e.g. mounts = {checkpoints = "/ckpt"}
    mounts: dict[str, str] = Field(default_factory=dict)
    # a GPU allocated to a Slurm job (its processes' SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES) at or under
    # idle_gpu_max_util_pct this long is reported once as gpu_idle (agent/idlegpu.py); 0 turns it off
    idle_gpu_after_s: Seconds = Field(1800.0, ge=0)
    idle_gpu_max_util_pct: float = Field(5.0, ge=0, lt=100)  # utilisation counted as idle, %
    # set: an idle GPU counts only while it also holds at most this much memory, MiB (unset: memory does not
    # decide; the most it held is reported either way)
    idle_gpu_max_memory_mib: float | None = Field(None, ge=0, allow_inf_nan=False)
    # The node status file for Slurm's HealthCheckProgram (agent/nodestatus.py); None = <state_dir>/node-status.json.
    status_file: Path | None = None
    status_interval_s: Seconds = Field(10.0, gt=0)  # seconds between rewrites of the status file (a new fault: at once)
    status_hold_s: Seconds = Field(600.0, gt=0)  # an observation stays in the status file this many seconds
    # Repair commands from the controller (agent/commands.py; with push only).
    commands: bool = True  # carry out repair commands the controller queues for this node
    command_poll_s: Seconds = Field(10.0, gt=0)  # seconds between polls of GET /v1/nodes/{node}/commands
    reboot_command: list[str] = Field(default_factory=lambda: ["systemctl", "reboot"], min_length=1)  # argv of a reboot
    reboot_wait_s: Seconds = Field(900.0, gt=0)  # after reboot_command exits 0: boot id unchanged this long = failed
    fabric_manager_command: list[str] = Field(  # argv that restarts NVIDIA Fabric Manager
        default_factory=lambda: ["systemctl", "restart", "nvidia-fabricmanager"], min_length=1)
    # Maintenance rollouts (agent/maintenance.py, docs/maintenance.md): name -> argv of the scripts a rollout
    # may run here as its action (script:<name>); the controller only ever sends a name from this table
    maintenance_scripts: dict[str, list[str]] = Field(default_factory=dict)
    maintenance_timeout_s: Seconds = Field(3600.0, gt=0)  # a maintenance script still running after this failed
    cadence: CadenceModel = Field(default_factory=CadenceModel)  # see [cadence]: how often each source is read
    thresholds: ThresholdsModel = Field(default_factory=ThresholdsModel)  # see [thresholds]: when a reading is reported

    @field_validator("idle_gpu_max_memory_mib", mode="before")
    @classmethod
    def _memory_not_a_switch(cls, v: object) -> object:
        if isinstance(v, bool):  # `= true` would silently mean 1 MiB: no GPU would ever count as idle
            raise ValueError("MiB of GPU memory (a number >= 0), or the key left out to let memory not decide")
        return v

    @field_validator("sim_absent")
    @classmethod
    def _absent_slots(cls, v: list[str]) -> list[str]:
        for slot in v:
            if not re.fullmatch(r"(gpu|nic)\d+", slot):
                raise ValueError(f"slot {slot!r}: gpu<I> or nic<K> (a simulated GPU or HCA slot, from 0)")
        return v

    @field_validator("maintenance_scripts")
    @classmethod
    def _script_names(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, argv in v.items():
            if not SCRIPT_NAME.match(name):
                raise ValueError(f"script name {name!r}: lowercase letters, digits, - and _, at most 25")
            if not argv or not all(argv):
                raise ValueError(f"script {name!r}: an argv of one or more non-empty strings")
        return v


def load_config(path: Path | None = None, **overrides: object) -> AgentConfig:
    """TOML file (if any) < environment < ``overrides`` (CLI options; ``None`` values are ignored).

    Raises InvalidInput naming the first bad field.
    """
    data: dict[str, object] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as err:
            raise InvalidInput("config", str(path), f"a readable TOML file ({err.strerror})") from None
        except tomllib.TOMLDecodeError as err:
            raise InvalidInput("config", str(path), f"valid TOML ({err})") from None
    data = below_environment(data, "GPUFLEET_AGENT_")  # the environment overrides the file
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return AgentConfig(**data)  # type: ignore[arg-type]
    except ValidationError as err:
        raise invalid_input(err, AgentConfig) from None


def read_token(path: Path | None) -> str:
    """The node's bearer token from ``path`` (first line, stripped)."""
    if path is None:
        raise InvalidInput("--token-file", None, "a file holding this node's controller token (or --no-push)")
    try:
        text = path.read_text().strip()
    except OSError as err:
        raise InvalidInput("--token-file", str(path), f"a readable file ({err.strerror})") from None
    token = text.splitlines()[0].strip() if text else ""
    if not token:
        raise InvalidInput("--token-file", str(path), "a file holding a non-empty token")
    return token
