from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.kmsg import KmsgFollower, boot_time
from gpufleet.domain.events import EventKind, HealthEvent

BTIME = 1_795_000_000
XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-f:.]+)\): (\d+)")

RECORDS = [
    "6,1001,5012345,-;pci 0000:18:00.0: [10de:2330] type 00 class 0x030200",
    " SUBSYSTEM=pci",
    " DEVICE=+pci:0000:18:00.0",
    "4,1002,81234567,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "3,1003,81234999,-;NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    "4,1004,92000000,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=999, DBE (0x1) Double Bit Error",
]


def decode(message: str) -> Iterator[HealthEvent]:
    m = XID.search(message)
    if m:
        yield HealthEvent(
            id="decoder-id",
            node="?",
            kind=EventKind.XID,
            time=datetime(2000, 1, 1, tzinfo=UTC),
            code=int(m.group(2)),
            message=message,
            source="kmsg",
        )


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text("b00t-1\n")
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {BTIME}\nprocesses 10\n")
    return root


def follower(tmp_path: Path, proc: Path, kmsg: Path, **kw: object) -> KmsgFollower:
    return KmsgFollower(
        "n1",
        decode,
        clock=FakeClock(),
        kmsg_path=kmsg,
        state_path=tmp_path / "pos.json",
        proc_root=proc,
        **kw,
    )  # type: ignore[arg-type]


def test_decodes_with_deterministic_ids_and_kernel_time(tmp_path: Path, proc: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(RECORDS) + "\n")
    f = follower(tmp_path, proc, kmsg)
    assert f.start() == "kmsg"
    evs = f.poll()
    assert [(e.id, e.code) for e in evs] == [("n1:kmsg:b00t-1:1002:0", 79), ("n1:kmsg:b00t-1:1004:0", 48)]
    assert evs[0].node == "n1"
    assert evs[0].time == datetime.fromtimestamp(BTIME, UTC) + timedelta(microseconds=81234567)
    assert f.lines == 4  # continuation lines are not messages
    assert f.poll() == []
    f.close()


def test_resume_skips_what_was_committed(tmp_path: Path, proc: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(RECORDS[:4]) + "\n")
    f = follower(tmp_path, proc, kmsg)
    f.start()
    assert [e.code for e in f.poll()] == [79]
    f.commit()
    f.close()
    with kmsg.open("a") as fh:
        fh.write("\n".join(RECORDS[4:]) + "\n")
    g = follower(tmp_path, proc, kmsg)  # a restart re-reads the whole ring buffer
    g.start()
    assert [e.code for e in g.poll()] == [48]
    g.close()


def test_uncommitted_position_resends_same_ids(tmp_path: Path, proc: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(RECORDS) + "\n")
    f = follower(tmp_path, proc, kmsg)
    f.start()
    first = [e.id for e in f.poll()]
    f.close()  # crashed before commit
    g = follower(tmp_path, proc, kmsg)
    g.start()
    assert [e.id for e in g.poll()] == first
    g.close()


def test_new_boot_forgets_old_position(tmp_path: Path, proc: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(RECORDS) + "\n")
    f = follower(tmp_path, proc, kmsg)
    f.start()
    f.poll()
    f.commit()
    f.close()
    (proc / "sys/kernel/random/boot_id").write_text("b00t-2\n")
    g = follower(tmp_path, proc, kmsg)
    g.start()
    assert [e.id for e in g.poll()] == ["n1:kmsg:b00t-2:1002:0", "n1:kmsg:b00t-2:1004:0"]
    g.close()


def test_partial_record_waits_for_its_end(tmp_path: Path, proc: Path) -> None:
    kmsg = tmp_path / "kmsg"
    line = RECORDS[3]
    kmsg.write_text(line[:30])
    f = follower(tmp_path, proc, kmsg)
    f.start()
    assert f.poll() == []
    with kmsg.open("a") as fh:
        fh.write(line[30:] + "\n")
    assert [e.code for e in f.poll()] == [79]
    f.close()


def test_decoder_crash_is_contained(tmp_path: Path, proc: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("\n".join(RECORDS) + "\n")

    def flaky(message: str) -> list[HealthEvent]:
        if "48" in message:
            raise RuntimeError("decoder bug")
        return list(decode(message))

    f = KmsgFollower("n1", flaky, clock=FakeClock(), kmsg_path=kmsg, proc_root=proc)
    f.start()
    assert [e.code for e in f.poll()] == [79]
    f.close()


FAKE_JOURNALCTL = """
import json, sys
entries = json.loads(sys.argv[1])
for e in entries:
    print(json.dumps(e), flush=True)
with open(sys.argv[2], "w") as fh:
    fh.write(json.dumps(sys.argv[3:]))
"""


def test_falls_back_to_journalctl(tmp_path: Path, proc: Path) -> None:
    script = tmp_path / "journalctl.py"
    script.write_text(FAKE_JOURNALCTL)
    args_file = tmp_path / "argv.json"
    entries = [
        {
            "__CURSOR": "s=abc;i=1",
            "__REALTIME_TIMESTAMP": "1795000081000000",
            "MESSAGE": "usb 1-1: new device",
        },
        {
            "__CURSOR": "s=abc;i=2",
            "__REALTIME_TIMESTAMP": "1795000082000000",
            "MESSAGE": "NVRM: Xid (PCI:0000:9a:00): 94, pid=7, Contained: SM (0x1)",
        },
        {
            "__CURSOR": "s=abc;i=3",
            "__REALTIME_TIMESTAMP": "1795000083000000",
            "MESSAGE": list(b"NVRM: Xid (PCI:0000:ab:00): 31, bytes form"),
        },
    ]
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([*argv[:2], json.dumps(entries), str(args_file), *argv[2:]], stdout=subprocess.PIPE)
        spawned.append(p)
        return p

    f = follower(tmp_path, proc, tmp_path / "no-kmsg", journalctl=[sys.executable, str(script)], spawn=spawn)
    assert f.start() == "journal"
    spawned[0].wait(timeout=30)
    evs = f.poll()
    assert [e.code for e in evs] == [94, 31]
    assert evs[0].time == datetime.fromtimestamp(1795000082, UTC)
    assert evs[0].id.startswith("n1:journal:") and evs[0].id != evs[1].id
    argv = json.loads(args_file.read_text())
    assert argv[:5] == ["-k", "-f", "-o", "json", "--no-pager"] and "--lines=all" in argv
    f.commit()
    f.close()
    g = follower(tmp_path, proc, tmp_path / "no-kmsg", journalctl=[sys.executable, str(script)], spawn=spawn)
    g.start()
    spawned[1].wait(timeout=30)
    assert "--after-cursor=s=abc;i=3" in json.loads(args_file.read_text())
    g.close()


def test_no_kmsg_and_no_journalctl_is_not_a_crash(tmp_path: Path, proc: Path) -> None:
    def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    f = follower(tmp_path, proc, tmp_path / "no-kmsg", spawn=spawn)
    assert f.start() == "none"
    assert f.poll() == []
    f.close()


def test_a_recorded_or_test_proc_root_keeps_its_btime(proc: Path) -> None:
    """A ``/proc`` that is not this machine's (a test's, a recorded one) is taken at its word: its
    ``btime``, not this machine's boot."""
    assert boot_time(proc) == datetime.fromtimestamp(BTIME, UTC)
    (proc / "stat").write_text("cpu  1 2 3\n")
    assert boot_time(proc) is None


def test_this_machines_boot_time_is_not_rounded_to_the_second() -> None:
    """A record the kernel stamps now must land now. ``btime`` alone is whole seconds (truncated): on a
    real H200 every kernel-log XID landed 0.93 s before NVML delivered it. Checked against the kernel's
    own uptime (``/proc/uptime``, 10 ms resolution), which the boot time is not computed from. (The agent
    runs on Linux only: this reads the machine's own /proc.)"""
    real = Path("/proc")
    btime = next(int(ln.split()[1]) for ln in (real / "stat").read_text().splitlines() if ln.startswith("btime "))
    boot = boot_time(real)
    assert boot is not None
    assert btime <= boot.timestamp() < btime + 1
    before = datetime.now(UTC)
    up = float((real / "uptime").read_text().split()[0])
    after = datetime.now(UTC)
    placed = boot + timedelta(seconds=up)
    assert before - timedelta(seconds=0.05) <= placed <= after + timedelta(seconds=0.05), (placed, before, after)
