"""The agent's part of a diagnostic bundle: what a vendor RMA asks for, captured when the node enters
repair (command ``diagnostic_bundle`` on the command channel; docs/bmc.md#diagnostic-bundles).

* ``nvidia_bug_report``: ``nvidia-bug-report.sh --output-file ...`` when the command exists on the node
  (its ``.log.gz``, base64), else ``skipped`` with the reason; a report over ``max_report_bytes`` is
  left on the node (its path said) rather than sent.
* ``kernel_log``: ``gpufleet diagnose --json`` over the node's recent kernel log (the replayed
  ``kmsg_file``, else the records buffered in ``/dev/kmsg``, at most ``KERNEL_LINES`` lines), run as
  a separate process exactly as an operator would.
* ``nvml``: the device's state now: driver, every GPU's identity and its fast and slow readings
  (on a simulated node the simulated device's).

The controller adds its own parts (the node's recent check results, the BMC's SEL excerpt, the repair
it is for) when the bundle is uploaded. Never raises: a part that fails says why.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.agent.config import AgentConfig
from gpufleet.agent.devices.port import Device

KERNEL_LINES = 5000
BUG_REPORT = "nvidia-bug-report.sh"


def collect(cfg: AgentConfig, device: Device, *, max_report_bytes: int = 8 * 1024 * 1024,
            which: Callable[[str], str | None] = shutil.which) -> dict[str, Any]:
    return {"node": cfg.node, "captured": datetime.now(UTC).isoformat(),
            "nvidia_bug_report": _bug_report(cfg, which, max_report_bytes),
            "kernel_log": _diagnose(cfg), "nvml": _nvml(device)}


def summary(doc: dict[str, Any]) -> str:
    parts = []
    for key in ("nvidia_bug_report", "kernel_log", "nvml"):
        part = doc.get(key) or {}
        parts.append(f"{key}: {part.get('status', '?')}" + (f" ({part['reason']})" if part.get("reason") else ""))
    return "; ".join(parts)


def _bug_report(cfg: AgentConfig, which: Callable[[str], str | None], cap: int) -> dict[str, Any]:
    exe = which(BUG_REPORT)
    if exe is None:
        return {"status": "skipped", "reason": f"{BUG_REPORT} not found on this node"}
    out_dir = cfg.state_dir / "bug-reports"
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"nvidia-bug-report-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.log"
    try:
        res = subprocess.run([exe, "--output-file", str(base)], capture_output=True, text=True, timeout=900,
                             check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return {"status": "failed", "reason": f"{BUG_REPORT}: {err}"}
    produced = base.with_name(base.name + ".gz")
    path = produced if produced.exists() else base
    if res.returncode != 0 or not path.exists():
        return {"status": "failed", "reason": f"{BUG_REPORT} exit {res.returncode}: {(res.stderr or '')[-300:]}"}
    size = path.stat().st_size
    if size > cap:
        return {"status": "on_node", "reason": f"{size} bytes (over {cap}): kept on the node", "path": str(path)}
    return {"status": "captured", "file": path.name, "bytes": size,
            "base64": base64.b64encode(path.read_bytes()).decode()}


def _kernel_text(cfg: AgentConfig) -> tuple[str, str]:
    if cfg.kmsg_file is not None:
        return cfg.kmsg_file.read_text(encoding="utf-8", errors="replace"), str(cfg.kmsg_file)
    lines: list[str] = []
    fd = os.open(cfg.kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                rec = os.read(fd, 8192)
            except BlockingIOError:
                break  # the buffer is drained
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not rec:
                break
            lines.append(rec.decode("utf-8", errors="replace").rstrip("\n"))
    finally:
        os.close(fd)
    return "\n".join(lines) + "\n", str(cfg.kmsg_path)


def _diagnose(cfg: AgentConfig) -> dict[str, Any]:
    try:
        text, source = _kernel_text(cfg)
    except OSError as err:
        return {"status": "failed", "reason": f"cannot read the kernel log: {err}"}
    recent = "\n".join(text.splitlines()[-KERNEL_LINES:]) + "\n"
    with tempfile.NamedTemporaryFile("w", suffix=".log", dir=cfg.state_dir, delete=False) as fh:
        fh.write(recent)
        tmp = Path(fh.name)
    try:
        argv = [sys.executable, "-m", "gpufleet.cli", "diagnose", "--json", "--width", "0", str(tmp)]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return {"status": "failed", "reason": f"gpufleet diagnose: {err}"}
    finally:
        tmp.unlink(missing_ok=True)
    try:
        findings = json.loads(res.stdout) if res.stdout.strip() else []
    except ValueError:
        return {"status": "failed", "reason": f"gpufleet diagnose exit {res.returncode}: {res.stderr[-300:]}"}
    return {"status": "captured", "source": source, "lines": len(recent.splitlines()),
            "command": "gpufleet diagnose --json", "exit": res.returncode, "findings": findings}


def _nvml(device: Device) -> dict[str, Any]:
    try:
        gpus = []
        for g in device.gpus():
            gpus.append({"info": dataclasses.asdict(g), "fast": _plain(device.read_fast(g.index)),
                         "slow": _plain(device.read_slow(g.index))})
        return {"status": "captured", "device": type(device).__name__, "gpus": gpus}
    except Exception as err:  # a driver in a bad state is exactly when this runs
        return {"status": "failed", "reason": f"{type(err).__name__}: {err}"}


def _plain(reading: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(reading), default=str))
