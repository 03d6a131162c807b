"""Out of band, end to end with real processes: a ``gpufleet controller serve`` whose BMC watcher reads a
Redfish SEL (sushy-tools' ``sushy-static`` serving a mockup), and a ``gpufleet agent --device sim``.

A power-supply failure in the BMC's event log is judged by the controller (catalog rule ``bmc_psu``:
degraded, replace) and drains the idle node; entering repair, the node's agent captures a diagnostic
bundle (nvidia-bug-report skipped and said so, ``gpufleet diagnose --json`` of its kernel log, the
simulated device's NVML state) and uploads it; the controller adds the node's check results and the SEL
excerpt, stores it with the repair record, files the hardware ticket with a link to it, and the bundle
downloads through the API with a token (and not without one). The BMC password, given as a ``file:``
reference in a 0600 secrets file, appears in no log of either process, no audit line and no API answer.
"""

from __future__ import annotations

import gzip
import json
import secrets
import shutil
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from tests.e2e.harness import ADMIN_TOKEN, BASE_POLICY, Fleet, dmesg_now, wait_until
from tests.integration.bmc.emulators import Mockup, start_static
from tests.integration.reconciler.test_repair_ladder import Tickets

pytestmark = [pytest.mark.e2e, pytest.mark.redfish]

NODE = "r01-n01"
KERNEL = ["NVRM: Xid (PCI:0000:18:00): 13, pid=2405, name=python3, Graphics Exception: ESR 0x404600=0x80000001"]


def test_a_sel_fault_drains_the_node_and_the_repair_captures_a_downloadable_bundle(
        fleet: Fleet, tmp_path: Path) -> None:
    assert shutil.which("nvidia-bug-report.sh") is None  # this machine has no NVIDIA driver: the part is skipped
    password, user = "Pw-" + secrets.token_hex(12), "gf-bmc-" + secrets.token_hex(4)
    mock = Mockup(tmp_path / "mockup")
    bmc = start_static(mock.root, tmp_path / "static.log")
    tickets = Tickets()
    try:
        pw_file = tmp_path / "bmc-password"
        pw_file.write_text(password + "\n")
        bmc_file = tmp_path / "bmc.toml"
        bmc_file.write_text(f'[defaults]\nusername = "{user}"\npassword = "file:{pw_file}"\n\n'
                            f'[nodes.{NODE}]\naddress = "{bmc.url}"\n')
        bmc_file.chmod(0o600)
        ctl = fleet.controller(nodes=[NODE], policy=BASE_POLICY.replace("auto_repair = false", "auto_repair = true"),
                               extra_config=f'[repair]\nagent = true\nticket_url = "{tickets.url}"\n'
                                            f'bmc_file = "{bmc_file}"\nbmc_allow_http = true\nsel_interval = 0.3\n'
                                            'firmware_interval = 0\nbundle_timeout = "2m"\n')
        kmsg = tmp_path / "kernel.log"
        kmsg.write_text(dmesg_now(KERNEL))
        fleet.agent(NODE, "--gpus", "2", "--kmsg-file", str(kmsg), env={"GPUFLEET_AGENT_COMMAND_POLL_S": "0.3"})
        assert ctl.api.node_state(NODE) == "ready"
        mock.add_entry("17", datetime.now(UTC), sensor="Power Supply / Converter", severity="Critical",
                       message="Power supply PSU2 failure detected (AC lost)")

        wait_until(lambda: tickets.bodies, lambda: f"a ticket; actions: {ctl.api.actions(NODE)}", 60)
        ticket = tickets.bodies[0]
        assert ticket["node"] == NODE and ticket["fault"]["action"] == "replace"
        psu = [e for e in ctl.api.events(NODE) if e["source"] == "bmc"]
        assert len(psu) == 1 and psu[0]["severity"] == "degraded"
        assert ctl.api.node_state(NODE) == "repair"
        link = ticket["bundle"]
        assert link["url"] == f"/v1/bundles/{link['id']}"

        url = ctl.url + link["url"]
        assert httpx.get(url, timeout=10).status_code == 401
        r = httpx.get(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
        assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
        doc = json.loads(gzip.decompress(r.content))
        agent = doc["agent"]
        assert agent["nvidia_bug_report"]["status"] == "skipped"
        assert "not found" in agent["nvidia_bug_report"]["reason"]
        kernel = agent["kernel_log"]
        assert kernel["status"] == "captured" and kernel["source"] == str(kmsg)
        assert any("13" in json.dumps(f) and "xid" in json.dumps(f).lower() for f in kernel["findings"]), kernel
        nvml = agent["nvml"]
        assert nvml["status"] == "captured" and len(nvml["gpus"]) == 2
        assert all(g["info"]["uuid"] for g in nvml["gpus"])
        assert doc["bmc_sel"]["status"] == "captured"
        assert [e["Message"] for e in doc["bmc_sel"]["entries"]] == ["Power supply PSU2 failure detected (AC lost)"]
        assert psu[0]["id"] in [c["id"] for c in doc["checks"]["results"]]
        listed = ctl.api.get(f"/nodes/{NODE}/bundles")["bundles"]
        assert [b["id"] for b in listed] == [link["id"]]

        texts = [ctl.proc.text(10**7), fleet.agents[NODE].proc.text(10**7), json.dumps(ctl.api.audit()),
                 json.dumps(ctl.api.actions(NODE)), json.dumps(ticket), r.content.decode("latin-1"),
                 json.dumps(doc)]
        for text in texts:
            assert password not in text
    finally:
        tickets.server.shutdown()
        bmc.stop()
