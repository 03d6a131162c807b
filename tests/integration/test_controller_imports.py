"""A controller start imports what every controller needs, not the clients of optional integrations:
the Redfish client (``sushy``, with ``requests``) loads when a BMC is first asked something, ``httpx``
when a ticket is first sent. Each start of ``controller serve`` paid about 0.5-0.7 s for them on the
reference box, and the crash, failover and e2e tests start a controller dozens of times. That the
adapters still work, importing their client at first use, is what tests/integration/bmc (a Redfish
server) and the ticket executor's tests (a webhook) show."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = ("sushy", "requests", "httpx")


def test_a_controller_start_imports_no_optional_client() -> None:
    # what `gpufleet controller serve` imports before it reads its settings: the CLI, its controller
    # commands and the runtime they build (with the BMC and ticket adapters' modules)
    probe = ("import json, sys\n"
             "import gpufleet.cli, gpufleet.cli.controller, gpufleet.controller.runtime\n"
             "import gpufleet.controller.bmc.redfish, gpufleet.controller.executors.ticket\n"
             f"print(json.dumps(sorted(m for m in {OPTIONAL!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
