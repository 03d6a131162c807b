"""Maintenance actions on the node: the scripts a maintenance rollout may run (docs/maintenance.md).

A rollout queues ``script:<name>`` on the command channel (agent.commands). The agent runs only a script
its OWN config names (``[maintenance_scripts]``: name -> argv); the controller sends a name, never a
command line, so a stolen operator token cannot run arbitrary code on the fleet. The script runs with
``GPUFLEET_NODE`` set to the node's name; exit 0 is success, anything else (or a timeout) is a failure
and the node stays out of service. At most once, like every command: the agent's journal.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from gpufleet.agent.commands import NodeRepairs, Outcome, _last
from gpufleet.lifecycle.maintenance import SCRIPT_PREFIX


class MaintenanceScripts:
    """``script:<name>`` commands; everything else goes to ``inner`` (the repairs)."""

    def __init__(self, inner: NodeRepairs, scripts: Mapping[str, Sequence[str]], node: str, *,
                 timeout: float = 3600.0) -> None:
        self.inner, self.scripts, self.node, self.timeout = inner, dict(scripts), node, timeout

    def run(self, kind: str) -> Outcome:
        if not kind.startswith(SCRIPT_PREFIX):
            return self.inner.run(kind)
        name = kind[len(SCRIPT_PREFIX):]
        argv = self.scripts.get(name)
        if argv is None:
            known = ", ".join(sorted(self.scripts)) or "none"
            return Outcome(False, f"refused: this agent's config names no maintenance script {name!r} "
                                  f"(maintenance_scripts: {known})")
        try:
            res = subprocess.run(list(argv), capture_output=True, text=True, timeout=self.timeout, check=False,
                                 env={**os.environ, "GPUFLEET_NODE": self.node})
        except subprocess.TimeoutExpired:
            return Outcome(False, f"{name}: no exit within {self.timeout:g} s")
        except (OSError, subprocess.SubprocessError) as err:
            return Outcome(False, f"{name}: {err}")
        return Outcome(res.returncode == 0, f"{name} ({' '.join(argv)}): {_last(res) or f'exit {res.returncode}'}")
