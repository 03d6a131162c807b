"""``--kmsg-file``: a recorded kernel log replayed through the live follower's decoder."""

from __future__ import annotations

import hashlib
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.kmsgfile import KmsgFileReplay
from gpufleet.agent.decoding import default_decoder
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.runner import Agent
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "kernel-logs"
BTIME = 1_795_000_000
SLOTS = {"0000:5d:00.0": "n1-gpu3", "0000:cb:00.0": "n1-gpu6"}


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(f"cpu  1 2 3\nbtime {BTIME}\n")
    return root


def replay(path: Path, proc: Path, clock: FakeClock | None = None) -> KmsgFileReplay:
    r = KmsgFileReplay("n1", default_decoder("n1", SLOTS), path, clock=clock or FakeClock(), proc_root=proc)
    assert r.start() == "kmsg-file"
    return r


def copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copyfile(LOGS / name, dst)
    return dst


def test_dmesg_replay_ids_repeat_across_runs_and_times_follow_the_boot(tmp_path: Path, proc: Path) -> None:
    log = copy("xid79-dgx-h100-dmesg.log", tmp_path)
    first = replay(log, proc).poll()
    again = replay(log, proc).poll()
    assert [e.id for e in first] == [e.id for e in again] and len({e.id for e in first}) == len(first)
    key = hashlib.sha1(log.read_bytes()[:4096]).hexdigest()[:16]
    xid = next(e for e in first if e.kind is EventKind.XID)
    assert xid.id == f"n1:file:{key}:3:0" and xid.source == "kmsg-file" and xid.node == "n1"
    assert (xid.code, xid.component) == (79, "n1-gpu3")
    assert xid.time == datetime.fromtimestamp(BTIME, UTC) + timedelta(seconds=4254.197860)  # "[ 4254.197860]"


def test_lines_with_their_own_wall_clock_time_keep_it(tmp_path: Path, proc: Path) -> None:
    log = copy("xid-ctime-gpud46.log", tmp_path)  # dmesg -T: "[Fri Aug 30 11:43:14 2024] NVRM: Xid ...: 109"
    evs = replay(log, proc).poll()
    x109 = next(e for e in evs if e.code == 109)
    assert x109.time == datetime(2024, 8, 30, 11, 43, 14, tzinfo=UTC) and x109.component == "n1-gpu6"


def test_lines_without_time_take_the_clocks_now(tmp_path: Path, proc: Path) -> None:
    log = copy("xid79-154-journal.log", tmp_path)  # bare "NVRM: Xid (PCI:0000:01:00): 79, ..." lines
    clock = FakeClock(datetime(2026, 11, 21, 9, 30, tzinfo=UTC))
    evs = replay(log, proc, clock).poll()
    assert evs and all(e.time == clock.now() for e in evs)


def test_appended_lines_are_read_by_the_next_poll(tmp_path: Path, proc: Path) -> None:
    log = copy("kmsg-records.log", tmp_path)
    r = replay(log, proc)
    assert sorted(e.code for e in r.poll() if e.kind is EventKind.XID) == [79, 94, 94]
    assert r.poll() == []
    with log.open("a") as fh:
        fh.write("4,1030,4254300000,-;NVRM: Xid (PCI:0000:5d:00): 48, pid=7, name=python3, Ch 00000008")
    assert r.poll() == []  # no newline yet: the line may still be growing
    with log.open("a") as fh:
        fh.write("\n")
    [ev] = r.poll()
    assert (ev.code, ev.component, ev.id) == (48, "n1-gpu3", f"n1:file:{r.key}:8:0")
    assert ev.time == datetime.fromtimestamp(BTIME, UTC) + timedelta(microseconds=4254300000)
    r.close()


def test_an_unknown_pci_address_is_reported_against_the_node(tmp_path: Path, proc: Path) -> None:
    """Through the runner: the replay is the agent's kernel-log source; the node has GPUs, none at 9b."""
    log = copy("kmsg-records.log", tmp_path)  # XID 94 twice at 0000:9b:00, which no simulated GPU has
    clock = FakeClock()
    events: list[HealthEvent] = []
    dev = SimDevice(8, clock=clock)
    agent = Agent("n1", dev, clock, kmsg=replay(log, proc, clock), on_events=events.extend)
    agent.open()
    agent.tick()
    x94 = [e for e in events if e.code == 94]
    assert len(x94) == 2 and all(e.component == "n1" and dict(e.attrs)["pci"] == "0000:9b:00.0" for e in x94)
    assert all("gpu" not in dict(e.attrs) for e in x94)
    x79 = next(e for e in events if e.code == 79)
    assert x79.component == "n1-gpu3" and dict(x79.attrs)["gpu"] == "3"  # sim GPU 3 sits on bus 5d
    assert agent.telemetry.kmsg_lines == 7


def test_a_missing_file_names_the_option(tmp_path: Path, proc: Path) -> None:
    r = KmsgFileReplay("n1", default_decoder("n1"), tmp_path / "nope.log", clock=FakeClock(), proc_root=proc)
    with pytest.raises(InvalidInput) as err:
        r.start()
    assert err.value.field == "--kmsg-file" and err.value.value == str(tmp_path / "nope.log")


def test_an_xid_line_the_decoder_cannot_read_is_counted_on_the_agents_metrics(tmp_path: Path, proc: Path) -> None:
    """A driver printing an Xid in a form no rule reads must not pass as a quiet log."""
    from prometheus_client import generate_latest

    from gpufleet.agent.exporter import make_registry

    log = tmp_path / "dmesg.log"
    log.write_text("[ 10.000001] NVRM: Xid (PCI:0000:5d:00): abc, pid=1\n"
                   "[ 11.000001] NVRM: Xid (PCI:0000:5d:00): 79, pid=2, GPU has fallen off the bus.\n"
                   "[ 12.000001] NVRM: Xid 48\n"
                   "[ 13.000001] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    clock = FakeClock()
    events: list[HealthEvent] = []
    agent = Agent("n1", SimDevice(1, clock=clock), clock, kmsg=replay(log, proc, clock), on_events=events.extend)
    agent.open()
    agent.tick()
    assert [e.code for e in events if e.kind is EventKind.XID] == [79]  # the readable one is still an event
    text = generate_latest(make_registry(agent.telemetry, None)).decode()
    assert "gpufleet_agent_kmsg_undecoded_total 2.0" in text, text
    assert "gpufleet_agent_kmsg_lines_total 4.0" in text


def test_a_log_followed_from_empty_keeps_its_ids_across_restarts_and_another_log_gets_new_ones(
        tmp_path: Path, proc: Path) -> None:
    """A drill: a per-node log followed from empty was hashed empty at the first start, and a restarted
    agent (the file grown past it) sent every line again under new ids: stored twice, counted stale."""
    src = (LOGS / "xid79-dgx-h100-dmesg.log").read_bytes()
    log, state = tmp_path / "kern.log", tmp_path / "state" / "kmsg-file-key.json"
    log.write_bytes(b"")

    def run() -> list[str]:
        r = KmsgFileReplay("n1", default_decoder("n1", SLOTS), log, clock=FakeClock(), proc_root=proc,
                           state_path=state)
        r.start()
        return [e.id for e in r.poll()]

    assert run() == []
    with log.open("ab") as fh:  # lines appended while it follows, then the agent restarts
        fh.write(src)
    first = run()
    assert first and first == run(), "the same log, grown: the same ids"
    with log.open("ab") as fh:
        fh.write(src)
    assert run()[:len(first)] == first, "grown again: the earlier lines keep their ids"
    other = tmp_path / "other.log"
    other.write_bytes(src)
    other.replace(log)  # another log at the same path (a new inode)
    assert set(run()).isdisjoint(first), "not the same file: new ids"
