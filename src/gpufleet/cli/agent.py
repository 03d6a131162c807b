"""``gpufleet agent``: run the node agent (telemetry, passive checks, Prometheus exporter, push)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.errors import configure_logging


def register(app: typer.Typer) -> None:
    @app.command()
    def agent(
        device: Annotated[
            str | None,
            typer.Option(help="GPU backend: nvml (real GPUs) or sim (simulated). Default: the config's, else nvml."),
        ] = None,
        gpus: Annotated[int | None, typer.Option(help="Simulated GPU count (--device sim).")] = None,
        controller: Annotated[str | None, typer.Option(help="Controller base URL, e.g. http://ctl:8470.")] = None,
        token_file: Annotated[Path | None, typer.Option(help="File holding this node's controller token.")] = None,
        metrics_port: Annotated[int | None, typer.Option(help="Prometheus port (default 9400; 0 = any).")] = None,
        metrics_addr: Annotated[str | None, typer.Option(help="Address to serve /metrics on.")] = None,
        push: Annotated[
            bool | None,
            typer.Option("--push/--no-push", help="Push events to the controller (default: the config's, else push)."),
        ] = None,
        node: Annotated[str | None, typer.Option(help="Node name (default: hostname).")] = None,
        config: Annotated[Path | None, typer.Option(help="TOML config file (see docs/agent.md).")] = None,
        state_dir: Annotated[Path | None, typer.Option(help="Spool and kernel-log position directory.")] = None,
        ib_root: Annotated[Path | None, typer.Option(help="InfiniBand sysfs root.")] = None,
        kmsg: Annotated[bool | None, typer.Option("--kmsg/--no-kmsg", help="Follow the kernel log.")] = None,
        kmsg_path: Annotated[
            Path | None,
            typer.Option(
                help="Kernel log to follow (default /dev/kmsg); with --device sim a regular file here "
                "is the simulated kernel ring the simulated driver writes to."
            ),
        ] = None,
        kmsg_file: Annotated[
            Path | None,
            typer.Option(
                help="Replay this recorded kernel log from its start (then follow appended lines) "
                "instead of the live kernel log."
            ),
        ] = None,
        print_inventory: Annotated[
            bool, typer.Option("--print-inventory", help="Print the node's inventory as JSON and exit.")
        ] = False,
        inject: Annotated[
            list[str] | None,
            typer.Option(
                help="Simulated fault KIND[:ARG]@TARGET[@+SECONDS] (--device sim; repeatable), e.g. "
                "xid:94@gpu1, ecc_dbe@gpu0, ib_down@nic5@+30. Kinds: docs/agent.md."
            ),
        ] = None,
        sim_nics: Annotated[int | None, typer.Option(help="Simulated InfiniBand HCAs (default: one per GPU).")] = None,
        sim_seed: Annotated[int | None, typer.Option(help="Seed of the simulated device.")] = None,
        sim_serial_prefix: Annotated[
            str | None,
            typer.Option(
                help="Serials of the simulated chassis (PREFIX), GPUs (PREFIXG<i>) and NIC GUIDs "
                "(default: from node name and seed). Another node's prefix moves its tray here."
            ),
        ] = None,
        sim_gpu_serials: Annotated[
            str | None, typer.Option(help="Comma-separated serials of the simulated GPUs (empty keeps one).")
        ] = None,
        duration: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
        log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
    ) -> None:
        """Run the node agent until SIGTERM/SIGINT (or --duration); or print its inventory (--print-inventory)."""
        from gpufleet.agent.app import check_options, run_agent
        from gpufleet.agent.app import print_inventory as collect_and_print
        from gpufleet.agent.config import load_config
        from gpufleet.agent.inventory import inventory_json
        from gpufleet.domain.errors import InvalidInput

        if device is not None and device not in ("nvml", "sim"):
            raise InvalidInput("--device", device, "nvml or sim")
        configure_logging(log_level)
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
            kmsg_path=kmsg_path,
            kmsg_file=kmsg_file,
            inject=inject or None,
            sim_nics=sim_nics,
            sim_seed=sim_seed,
            sim_serial_prefix=sim_serial_prefix,
            sim_gpu_serials=sim_gpu_serials.split(",") if sim_gpu_serials is not None else None,
        )
        check_options(cfg)
        if print_inventory:
            typer.echo(inventory_json(collect_and_print(cfg)))
            return
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
