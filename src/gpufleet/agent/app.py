"""Wiring: build every piece of the agent from an :class:`AgentConfig` and run it until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from gpufleet.agent.clock import Clock, SystemClock
from gpufleet.agent.collectors.host import HostCollector
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.collectors.kmsg import Decode, KmsgFollower, LogDecoder
from gpufleet.agent.config import AgentConfig, read_token
from gpufleet.agent.decoding import default_decoder
from gpufleet.agent.devices.port import Device
from gpufleet.agent.exporter import make_registry, serve
from gpufleet.agent.push import Backoff, ControllerClient, Pusher
from gpufleet.agent.rules import PassiveChecks
from gpufleet.agent.runner import Agent
from gpufleet.agent.spool import Spool
from gpufleet.agent.telemetry import Telemetry
from gpufleet.domain.errors import InvalidInput

log = logging.getLogger(__name__)


def make_device(cfg: AgentConfig, clock: Clock) -> Device:
    if cfg.device == "sim":
        from gpufleet.agent.devices.sim import SimDevice

        return SimDevice(cfg.gpus, seed=cfg.sim_seed, clock=clock)
    from gpufleet.agent.devices.nvml import NvmlDevice

    return NvmlDevice(clock=clock)


def run_agent(
    cfg: AgentConfig,
    stop: threading.Event,
    *,
    clock: Clock | None = None,
    device: Device | None = None,
    decode: Decode | LogDecoder | None = None,
    ready: Callable[[int], None] | None = None,
) -> Agent:
    """Run the agent until ``stop`` is set; returns the stopped agent. ``ready(port)`` is called once the
    metrics endpoint listens (port 0 in the config picks a free port)."""
    clock = clock or SystemClock()
    device = device or make_device(cfg, clock)
    spool: Spool | None = None
    pusher: Pusher | None = None
    client: ControllerClient | None = None
    if cfg.push:
        if not cfg.controller:
            raise InvalidInput("--controller", None, "the controller URL (or --no-push)")
        token = read_token(cfg.token_file)
        _ensure_dir(cfg.state_dir)
        spool = Spool(cfg.state_dir / "spool.db", cfg.spool_max_events)
        client = ControllerClient(cfg.controller, token)
        pusher = Pusher(
            spool,
            client,
            cfg.node,
            clock,
            batch_size=cfg.push_batch,
            heartbeat_s=cfg.heartbeat_s,
            backoff=Backoff(cfg.push_backoff_base_s, max(cfg.push_backoff_base_s, cfg.push_backoff_cap_s)),
        )
    telemetry = Telemetry(hostname=cfg.node)
    kmsg: KmsgFollower | None = None
    agent = Agent(
        cfg.node,
        device,
        clock,
        checks=PassiveChecks(cfg.node, cfg.thresholds.build()),
        telemetry=telemetry,
        cadence=cfg.cadence.build(),
        ib=InfinibandCollector(cfg.ib_root),
        host=HostCollector(cfg.sys_root, cfg.mounts),
        spool=spool,
        wake_pusher=None if pusher is None else pusher.kick,
    )
    status = agent.open()
    if cfg.kmsg:
        slots = {g.pci_bus_id: f"{cfg.node}-gpu{g.index}" for g in telemetry.gpus}
        dec: Decode | LogDecoder = decode or default_decoder(cfg.node, slots)
        state = None
        if cfg.push or cfg.state_dir.is_dir():
            _ensure_dir(cfg.state_dir)
            state = cfg.state_dir / "kmsg-position.json"
        kmsg = KmsgFollower(
            cfg.node, dec, clock=clock, kmsg_path=cfg.kmsg_path, state_path=state, proc_root=cfg.proc_root
        )
        agent.kmsg = kmsg
        telemetry.kmsg_source = kmsg.start()
        log.info("%s: kernel log source: %s", cfg.node, telemetry.kmsg_source)
    stop_http, port = serve(make_registry(telemetry, spool, pusher), cfg.metrics_port, cfg.metrics_addr)
    push_thread: threading.Thread | None = None
    if pusher is not None:
        push_thread = threading.Thread(target=pusher.run, args=(stop,), name="gpufleet-push", daemon=True)
        push_thread.start()
    log.info(
        "%s: agent up: device=%s (%s), metrics on %s:%d, push=%s",
        cfg.node,
        cfg.device,
        status.message,
        cfg.metrics_addr,
        cfg.metrics_port,
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
        stop_http()
        agent.close()
        if client is not None:
            client.close()
        if spool is not None:
            spool.close()
    return agent


def _ensure_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidInput("state_dir", str(path), f"a writable directory ({err.strerror})") from None
