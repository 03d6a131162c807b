"""Wiring: build every piece of the agent from an :class:`AgentConfig` and run it until stopped.

Order at start: check the options, open the node's surfaces (real, or simulated with ``--device sim``),
open the device, collect the inventory once (it goes to the controller with the push client), start the
kernel-log source (live, or the ``--kmsg-file`` replay), serve metrics, run.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from gpufleet.agent.clock import AgentClock, SystemClock
from gpufleet.agent.collectors.host import HostCollector
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.collectors.kmsg import Decode, KernelLog, KmsgFollower, LogDecoder, boot_time
from gpufleet.agent.collectors.kmsgfile import KmsgFileReplay
from gpufleet.agent.commands import boot_id_reader, start_poller
from gpufleet.agent.config import AgentConfig, read_token
from gpufleet.agent.decoding import default_decoder
from gpufleet.agent.devices.nvml import NvmlDevice
from gpufleet.agent.devices.port import Device
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.devices.simfaults import Fault, FaultInjector, parse_fault
from gpufleet.agent.devices.simhost import SimKernelLog, SimSysfs, gpu_serials, serial_prefix
from gpufleet.agent.exporter import make_registry, serve
from gpufleet.agent.idlegpu import IdleGpus
from gpufleet.agent.inventory import collect_inventory
from gpufleet.agent.nodestatus import NodeStatusWriter
from gpufleet.agent.nvlinkmap import capture_nvlink_remote
from gpufleet.agent.push import Backoff, ControllerClient, Pusher
from gpufleet.agent.rules import PassiveChecks
from gpufleet.agent.runner import Agent
from gpufleet.agent.spool import Spool
from gpufleet.agent.telemetry import Telemetry
from gpufleet.agent.tls import client_tls
from gpufleet.diagnose.nvlink_remote import load_nvlink_remote
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.fleet import gpu_slot
from gpufleet.domain.inventory import NodeInventory
from gpufleet.domain.nodestatus import STATUS_FILE_NAME

log = logging.getLogger(__name__)


DEFAULT_IB_ROOT = Path("/sys/class/infiniband")


@dataclass(frozen=True, slots=True)
class Surfaces:
    """Where this node is read: the GPU device, the InfiniBand tree, the ``/sys`` holding DMI, and for a
    simulated node the simulated surfaces its faults change (agent/devices/simhost.py)."""

    device: Device
    ib_root: Path
    sys_root: Path
    sim_sysfs: SimSysfs | None = None
    sim_kernel_log: SimKernelLog | None = None


def check_options(cfg: AgentConfig) -> list[Fault]:
    """Options that only make sense together; returns the parsed ``--inject`` faults. Raises InvalidInput."""
    if cfg.inject and cfg.device != "sim":
        raise InvalidInput("--inject", cfg.inject[0], "--device sim (faults are injected into simulated devices)")
    if len(cfg.sim_gpu_serials) > cfg.gpus:
        raise InvalidInput("sim_gpu_serials", cfg.sim_gpu_serials, f"at most {cfg.gpus} serials (--gpus)")
    return [parse_fault(spec) for spec in cfg.inject]


def open_surfaces(
    cfg: AgentConfig,
    clock: AgentClock,
    device: Device | None = None,
    *,
    sim_root: Path | None = None,
    kernel_log: bool = True,
) -> Surfaces:
    """The node's surfaces. ``--device sim`` builds a simulated ``/sys`` under ``sim_root`` (default
    ``<state_dir>/sim-sys``; its InfiniBand tree is used unless ``ib_root`` is set) and, when ``kernel_log``
    and ``kmsg_path`` is a regular file (or does not exist), makes that file the simulated kernel ring.
    A given ``device`` is used as is (a SimDevice without a kernel log gets this one)."""
    if cfg.device != "sim":
        return Surfaces(device or NvmlDevice(clock=clock), cfg.ib_root or DEFAULT_IB_ROOT, cfg.sys_root)
    prefix = cfg.sim_serial_prefix or serial_prefix(cfg.node, cfg.sim_seed)
    root = sim_root or cfg.state_dir / "sim-sys"
    absent = {kind: {int(a[len(kind):]) for a in cfg.sim_absent if a.startswith(kind)} for kind in ("gpu", "nic")}
    sysfs = SimSysfs(root, nics=cfg.gpus if cfg.sim_nics is None else cfg.sim_nics, serial=prefix,
                     absent=absent["nic"])
    klog: SimKernelLog | None = None
    path = cfg.kmsg_path
    if kernel_log and cfg.kmsg and cfg.kmsg_file is None and _sim_ring(path):
        klog = SimKernelLog(path, clock, boot_time(cfg.proc_root) or clock.now())
    if device is None:
        given = cfg.sim_gpu_serials + [""] * (cfg.gpus - len(cfg.sim_gpu_serials))  # "" keeps the default
        serials = [g or d for g, d in zip(given, gpu_serials(prefix, cfg.gpus), strict=True)]
        device = SimDevice(cfg.gpus, seed=cfg.sim_seed, clock=clock, serials=serials, kernel_log=klog,
                           absent=absent["gpu"])
    elif isinstance(device, SimDevice) and device.kernel_log is None:
        device.kernel_log = klog
    ib_root = cfg.ib_root or sysfs.ib_root
    return Surfaces(device, ib_root, sysfs.root, sysfs if cfg.ib_root is None else None, klog)


def print_inventory(
    cfg: AgentConfig, *, clock: AgentClock | None = None, device: Device | None = None
) -> NodeInventory:
    """``--print-inventory``: open the device, collect, close. A simulated node's tree lives in a temporary
    directory (its content depends only on the configuration); no kernel log is touched."""
    clock = clock or SystemClock()
    with tempfile.TemporaryDirectory(prefix="gpufleet-inventory-") as tmp:
        s = open_surfaces(cfg, clock, device, sim_root=Path(tmp), kernel_log=False)
        status = s.device.open()
        if not status.ok:
            log.warning("%s: device %s: %s; the inventory lists no GPUs", cfg.node, s.device.name, status.message)
        try:
            return collect_inventory(cfg.node, s.device, ib_root=s.ib_root, sys_root=s.sys_root)
        finally:
            s.device.close()


def run_agent(
    cfg: AgentConfig,
    stop: threading.Event,
    *,
    clock: AgentClock | None = None,
    device: Device | None = None,
    decode: Decode | LogDecoder | None = None,
    ready: Callable[[int], None] | None = None,
) -> Agent:
    """Run the agent until ``stop`` is set; returns the stopped agent. ``ready(port)`` is called once the
    metrics endpoint listens (port 0 in the config picks a free port)."""
    clock = clock or SystemClock()
    faults = check_options(cfg)
    if cfg.push and not cfg.controller:
        raise InvalidInput("--controller", None, "the controller URL (or --no-push)")
    token = read_token(cfg.token_file) if cfg.push else ""
    verify = client_tls(cfg.controller, cfg.ca_file, cfg.client_cert, cfg.client_key) if cfg.push and cfg.controller \
        else True
    if cfg.push or cfg.device == "sim":
        _ensure_dir(cfg.state_dir)
    surfaces = open_surfaces(cfg, clock, device)
    device = surfaces.device
    inject: FaultInjector | None = None
    if faults:
        if not isinstance(device, SimDevice):
            raise InvalidInput("--inject", cfg.inject[0], "a simulated device (--device sim)")
        inject = FaultInjector(
            faults, clock, device=device, sysfs=surfaces.sim_sysfs, kernel_log=surfaces.sim_kernel_log
        )
    spool: Spool | None = None
    pusher: Pusher | None = None
    client: ControllerClient | None = None
    telemetry = Telemetry(hostname=cfg.node)
    agent = Agent(
        cfg.node,
        device,
        clock,
        checks=PassiveChecks(cfg.node, cfg.thresholds.build()),
        telemetry=telemetry,
        cadence=cfg.cadence.build(),
        ib=InfinibandCollector(surfaces.ib_root),
        host=HostCollector(cfg.sys_root, cfg.mounts),
        inject=inject,
        idle=IdleGpus(cfg.node, timedelta(seconds=cfg.idle_gpu_after_s), cfg.idle_gpu_max_util_pct, cfg.proc_root,
                      cfg.idle_gpu_max_memory_mib) if cfg.idle_gpu_after_s else None,
    )
    status = agent.open()
    inventory = collect_inventory(cfg.node, device, ib_root=surfaces.ib_root, sys_root=surfaces.sys_root)
    log.info(
        "%s: inventory: %d GPUs, %d NICs, chassis serial %r",
        cfg.node,
        len(inventory.gpus),
        len(inventory.nics),
        inventory.serial,
    )
    if cfg.push:
        assert cfg.controller is not None
        spool = Spool(cfg.state_dir / "spool.db", cfg.spool_max_events)
        client = ControllerClient(cfg.controller, token, verify=verify)
        pusher = Pusher(
            spool,
            client,
            cfg.node,
            clock,
            batch_size=cfg.push_batch,
            heartbeat_s=cfg.heartbeat_s,
            backoff=Backoff(cfg.push_backoff_base_s, max(cfg.push_backoff_base_s, cfg.push_backoff_cap_s)),
            inventory=inventory,
        )
        agent.spool, agent.wake_pusher = spool, pusher.kick  # the first tick restores its edges
        agent.boot_id = boot_id_reader(cfg.proc_root)  # ... when they were seen on this boot (decision 0132)
    if cfg.kmsg or cfg.kmsg_file is not None:
        agent.kmsg = _kernel_log(cfg, clock, telemetry, decode)
        telemetry.kmsg_source = agent.kmsg.start()
        log.info("%s: kernel log source: %s", cfg.node, telemetry.kmsg_source)
    stop_http, port = serve(make_registry(telemetry, spool, pusher), cfg.metrics_port, cfg.metrics_addr)
    push_thread: threading.Thread | None = None
    if pusher is not None:
        push_thread = threading.Thread(target=pusher.run, args=(stop,), name="gpufleet-push", daemon=True)
        push_thread.start()
    node_status = start_status(cfg, agent, clock, stop,  # the node status file for slurmd (nodestatus.py)
                               reached=(lambda: pusher.last_success) if pusher is not None else None)
    def repaired(kind: str) -> None:
        agent.rearm()  # a condition still standing after the repair is reported again (decision 0132)
        if node_status is not None:
            node_status.clear(f"{kind} succeeded")

    commands = start_poller(cfg, token, device, stop,  # repair commands from the controller (commands.py)
                            on_repaired=repaired, verify=verify)
    log.info(
        "%s: agent up: device=%s (%s), metrics on %s:%d, push=%s",
        cfg.node,
        cfg.device,
        status.message,
        cfg.metrics_addr,
        port,
        cfg.controller if cfg.push else "off",
    )
    if ready is not None:
        ready(port)
    try:
        agent.run(stop)
    finally:
        if pusher is not None and push_thread is not None:
            pusher.kick.set()
            push_thread.join(timeout=15)
        if commands is not None:
            commands.join(timeout=15)
        stop_http()
        agent.close()
        if client is not None:
            client.close()
        if spool is not None:
            spool.close()
    return agent


def start_status(cfg: AgentConfig, agent: Agent, clock: AgentClock, stop: threading.Event,
                 reached: Callable[[], datetime | None] | None = None) -> NodeStatusWriter | None:
    """Keep the node status file (``status_file``, default ``<state_dir>/node-status.json``) in a thread;
    without ``status_file``, only where the agent keeps a state directory (pushing, or simulated)."""
    from datetime import timedelta

    if cfg.status_file is None and not (cfg.push or cfg.device == "sim"):
        return None
    path = cfg.status_file or cfg.state_dir / STATUS_FILE_NAME
    writer = NodeStatusWriter(path, cfg.node, clock, hold=timedelta(seconds=cfg.status_hold_s),
                              interval=cfg.status_interval_s, reached=reached)
    agent.on_events = writer.observe
    threading.Thread(target=writer.run, args=(stop,), name="gpufleet-status", daemon=True).start()
    return writer


def _kernel_log(
    cfg: AgentConfig, clock: AgentClock, telemetry: Telemetry, decode: Decode | LogDecoder | None
) -> KernelLog:
    """The recorded log of ``kmsg_file`` (replayed from its start), else the live kernel log."""
    slots = {g.pci_bus_id: gpu_slot(cfg.node, g.index) for g in telemetry.gpus}
    ports = (load_nvlink_remote(cfg.nvlink_remote_file, "nvlink_remote_file") if cfg.nvlink_remote_file
             else capture_nvlink_remote(cfg.nvlink_remote_command, cfg.state_dir)
             if cfg.device == "nvml" and cfg.nvlink_remote_command else None)
    dec: Decode | LogDecoder = decode or default_decoder(cfg.node, slots, ports)
    if cfg.kmsg_file is not None:
        key_state = None
        if cfg.push or cfg.state_dir.is_dir():
            _ensure_dir(cfg.state_dir)
            key_state = cfg.state_dir / "kmsg-file-key.json"
        return KmsgFileReplay(cfg.node, dec, cfg.kmsg_file, clock=clock, proc_root=cfg.proc_root, state_path=key_state)
    state = None
    if cfg.push or cfg.state_dir.is_dir():
        _ensure_dir(cfg.state_dir)
        state = cfg.state_dir / "kmsg-position.json"
    return KmsgFollower(cfg.node, dec, clock=clock, kmsg_path=cfg.kmsg_path, state_path=state, proc_root=cfg.proc_root)


def _sim_ring(path: Path) -> bool:
    """A ``kmsg_path`` that can be the simulated kernel ring: a regular file, or none yet (never the
    default ``/dev/kmsg``, even where a container lacks it)."""
    return path != Path("/dev/kmsg") and (path.is_file() or not path.exists())


def _ensure_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInput("state_dir", str(path), f"a writable directory ({err.strerror})") from None
