"""``gpufleet agent``: run the node agent (telemetry, passive checks, Prometheus exporter, push)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def agent(
        device: Annotated[str, typer.Option(help="GPU backend: nvml (real GPUs) or sim (simulated).")] = "nvml",
        gpus: Annotated[int | None, typer.Option(help="Simulated GPU count (--device sim).")] = None,
        controller: Annotated[str | None, typer.Option(help="Controller base URL, e.g. http://ctl:8080.")] = None,
        token_file: Annotated[Path | None, typer.Option(help="File holding this node's controller token.")] = None,
        metrics_port: Annotated[int | None, typer.Option(help="Prometheus port (default 9400; 0 = any).")] = None,
        metrics_addr: Annotated[str | None, typer.Option(help="Address to serve /metrics on.")] = None,
        push: Annotated[bool, typer.Option("--push/--no-push", help="Push events to the controller.")] = True,
        node: Annotated[str | None, typer.Option(help="Node name (default: hostname).")] = None,
        config: Annotated[Path | None, typer.Option(help="TOML config file (see docs/agent.md).")] = None,
        state_dir: Annotated[Path | None, typer.Option(help="Spool and kernel-log position directory.")] = None,
        ib_root: Annotated[Path | None, typer.Option(help="InfiniBand sysfs root.")] = None,
        kmsg: Annotated[bool | None, typer.Option("--kmsg/--no-kmsg", help="Follow the kernel log.")] = None,
        duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
        log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    ) -> None:
        """Run the node agent until SIGTERM/SIGINT (or --duration)."""
        from gpufleet.agent.app import run_agent
        from gpufleet.agent.config import load_config
        from gpufleet.domain.errors import InvalidInput

        if device not in ("nvml", "sim"):
            raise InvalidInput("--device", device, "nvml or sim")
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per push is noise
        cfg = load_config(
            config,
            device=device,
            gpus=gpus,
            controller=controller,
            token_file=token_file,
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
            push=push,
            node=node,
            state_dir=state_dir,
            ib_root=ib_root,
            kmsg=kmsg,
        )
        stop = threading.Event()

        def _stop(signum: int, _frame: object) -> None:
            logging.getLogger("gpufleet.agent").info("signal %d: stopping", signum)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if duration is not None:
            timer = threading.Timer(duration, stop.set)
            timer.daemon = True
            timer.start()
        run_agent(cfg, stop)
