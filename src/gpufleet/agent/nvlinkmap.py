"""The node's NVLink map, captured by the agent itself: ``nvidia-smi nvlink -R`` at start.

An SXid names an NVSwitch port; which GPU is on the far end of that port only ``nvidia-smi nvlink -R``
says (``diagnose/nvlink_remote.py`` reads it backwards). Sites could already point ``nvlink_remote_file``
at a capture they make at boot; with ``device = "nvml"`` and no such file, the agent now makes the capture
itself when it starts, keeps a copy in ``<state_dir>/nvlink-remote.txt`` (what it decoded with, for a
person to read) and uses it. A node without NVLink (PCIe cards), without ``nvidia-smi`` or whose command
fails is said once in the log and decoded without the map, as before.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gpufleet.diagnose.nvlink_remote import SwitchPorts, parse_nvlink_remote
from gpufleet.domain.errors import InvalidInput
from gpufleet.files import write_atomic

log = logging.getLogger(__name__)

CAPTURE_FILE = "nvlink-remote.txt"
TIMEOUT_S = 30.0


def capture_nvlink_remote(command: Sequence[str], state_dir: Path | None) -> SwitchPorts | None:
    """Run ``command`` (``nvidia-smi nvlink -R``) and read its output; ``None`` when there is no map to
    have (no command, a failure, no NVLink links). The output is kept in ``state_dir`` when given."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except FileNotFoundError:
        log.info("no %s on this node: SXid switch ports are reported without the GPU behind them", command[0])
        return None
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("could not capture the NVLink map (%s): SXid switch ports are reported without the GPU "
                    "behind them", err)
        return None
    if done.returncode != 0:
        log.warning("%s exited %d (%s): SXid switch ports are reported without the GPU behind them",
                    " ".join(command), done.returncode, (done.stderr or done.stdout).strip()[:200])
        return None
    try:
        ports = parse_nvlink_remote(done.stdout, " ".join(command))
    except InvalidInput as err:
        log.warning("could not read the NVLink map (%s): SXid switch ports are reported without the GPU "
                    "behind them", err)
        return None
    if not ports:
        log.info("no NVLink switch links on this node: nothing to map SXid switch ports to")
        return None
    if state_dir is not None and state_dir.is_dir():
        write_atomic(state_dir / CAPTURE_FILE, done.stdout)
    log.info("NVLink map captured: %d switch ports", len(ports))
    return ports
