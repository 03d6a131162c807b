"""The kernel-log follower with the real diagnose decoder (gpufleet.diagnose)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.kmsg import KmsgFollower
from gpufleet.agent.decoding import DiagnoseDecoder, default_decoder
from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.events import EventKind, Severity
from gpufleet.domain.judgement import judge_event

RECORDS = [
    "6,1001,5012345,-;pci 0000:18:00.0: [10de:2330] type 00 class 0x030200",
    "4,1002,81234567,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "3,1003,81234999,-;NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    "4,1004,92000000,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=999, name=python, Ch 00000008, DBE (0x1)",
]


def test_default_decoder_is_the_diagnose_decoder() -> None:
    dec = default_decoder("n1", {"0000:18:00.0": "n1-gpu0"})
    assert isinstance(dec, DiagnoseDecoder) and dec.slots == {"0000:18:00.0": "n1-gpu0"}


def test_follower_with_diagnose_decoder(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("b1\n")
    (proc / "stat").write_text("btime 1795000000\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(RECORDS) + "\n")
    dec = DiagnoseDecoder("n1", {"0000:18:00.0": "n1-gpu0", "0000:2a:00.0": "n1-gpu1"})
    f = KmsgFollower("n1", dec, clock=FakeClock(), kmsg_path=kmsg, proc_root=proc)
    f.start()
    evs = f.poll()
    xids = [e for e in evs if e.kind is EventKind.XID]
    assert [(e.code, e.component) for e in xids] == [(79, "n1-gpu0"), (48, "n1-gpu1")]
    assert xids[0].id == "n1:kmsg:b1:1002:0" and xids[0].node == "n1"
    # an observation: the line states nothing, the controller's catalog judges it (fatal)
    assert xids[0].severity is None and xids[0].source == "kmsg"
    assert judge_event(load_default_catalog(), xids[0]).severity is Severity.FATAL
    assert len({e.id for e in evs}) == len(evs)
    f.close()
