"""The wired agent (run_agent) follows a kernel log through the diagnose decoder and pushes what it finds."""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.clock import SystemClock
from gpufleet.agent.config import load_config
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.domain.events import EventKind
from tests.integration.agent.harness import running_agent, wait_for
from tests.unit.agent.controller_double import ControllerDouble

RECORDS = [
    "6,500,4000000,-;nvidia: loading out-of-tree module taints kernel.",
    "4,501,81234567,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "4,502,91000000,-;NVRM: Xid (PCI:0000:9a:00): 94, pid=77, name=python, Ch 00000010, errorString CTX SWITCH",
]


def test_kernel_log_to_controller(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("0e2c-boot\n")
    (proc / "stat").write_text("btime 1795000000\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(RECORDS) + "\n")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    ctl = ControllerDouble()
    ctl.start()
    try:
        cfg = load_config(
            None,
            node="r01-n003",
            device="sim",
            gpus=8,
            controller=ctl.url,
            token_file=token,
            state_dir=tmp_path / "state",
            metrics_port=0,
            metrics_addr="127.0.0.1",
            kmsg=True,
            kmsg_path=kmsg,
            proc_root=proc,
            ib_root=tmp_path / "no-ib",
            push_backoff_base_s=0.05,
            push_backoff_cap_s=0.5,
        )
        clock = SystemClock()
        with running_agent(cfg, SimDevice(8, clock=clock), clock) as agent:
            wait_for(lambda: len(ctl.events) >= 2, "kernel-log events at the controller")
            assert agent.metrics()["gpufleet_agent_kmsg_source{source=kmsg}"] == 1
        by_code = {e.code: e for e in ctl.events.values() if e.kind is EventKind.XID}
        assert set(by_code) == {79, 94}
        x79 = by_code[79]
        assert x79.id == "r01-n003:kmsg:0e2c-boot:501:0" and x79.component == "r01-n003-gpu0"
        # an observation: the line states no severity; the controller judges it with the site's catalog
        assert x79.source == "kmsg" and x79.severity is None and x79.attr("pci") == "0000:18:00.0"
        assert by_code[94].component == "r01-n003-gpu4"  # sim GPU 4 sits on bus 9a
        assert (tmp_path / "state" / "kmsg-position.json").read_text().count('"kmsg_seq": 502') == 1
    finally:
        ctl.stop()
