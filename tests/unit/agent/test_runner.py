from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pynvml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.collectors.kmsg import KmsgFollower
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.runner import Agent, Cadence
from gpufleet.agent.spool import Spool
from gpufleet.controller.api.schemas import EventIn
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.wire import to_wire
from tests.unit.agent.fake_nvml import FakeNvml, nvml_over_sim

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


class StopAt(FakeClock):
    """A fake clock that sets ``stop`` once ``until`` seconds have passed (and runs ``at`` hooks)."""

    def __init__(self, until: float, stop: threading.Event, at: dict[float, object] | None = None) -> None:
        super().__init__()
        self.until, self.stop = until, stop
        self.at = dict(at or {})

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        for t in sorted(list(self.at)):
            if self.monotonic() >= t:
                self.at.pop(t)()  # type: ignore[operator]
        if self.monotonic() >= self.until:
            self.stop.set()


class Counting(SimDevice):
    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.fast_reads = 0
        self.slow_reads = 0

    def read_fast(self, index: int):  # type: ignore[no-untyped-def]
        self.fast_reads += 1
        return super().read_fast(index)

    def read_slow(self, index: int):  # type: ignore[no-untyped-def]
        self.slow_reads += 1
        return super().read_slow(index)


def test_cadences_over_a_simulated_minute() -> None:
    stop = threading.Event()
    clock = StopAt(60.0, stop)
    dev = Counting(2, clock=clock)
    agent = Agent(
        "n1",
        dev,
        clock,
        cadence=Cadence(fast_s=1, slow_s=30, ib_s=5, host_s=30),
        ib=InfinibandCollector(FIX / "h100-healthy"),
    )
    agent.open()
    agent.run(stop)
    assert dev.fast_reads == 2 * 60  # t = 0..59
    assert dev.slow_reads == 2 * 2  # t = 0, 30
    assert agent.telemetry.ticks == 60
    assert len(agent.telemetry.ib) == 8


def test_faults_become_events_in_the_spool(tmp_path: Path) -> None:
    stop = threading.Event()
    holder: dict[str, SimDevice] = {}
    clock = StopAt(
        70.0,
        stop,
        at={
            5.0: lambda: holder["d"].inject_xid(1, 31),
            6.0: lambda: holder["d"].inject_xid(1, 31),
            10.0: lambda: holder["d"].add_ecc(2, dbe=1),
            20.0: lambda: holder["d"].fall_off_bus(3),
            40.0: lambda: holder["d"].thermal_excursion(0, 96.0),
        },
    )
    dev = holder["d"] = SimDevice(4, clock=clock)
    spool = Spool(tmp_path / "s.db")
    agent = Agent("n1", dev, clock, spool=spool)
    agent.open()
    agent.run(stop)
    got = [json.loads(b) for _, b in spool.peek(100)]
    kinds = [(e["kind"], e["component"], e["code"]) for e in got]
    assert kinds.count(("xid", "n1-gpu1", 31)) == 2
    assert ("xid", "n1-gpu3", 79) in kinds and ("gpu_lost", "n1-gpu3", None) in kinds
    assert ("ecc_dbe", "n1-gpu2", None) in kinds and ("row_remap_pending", "n1-gpu2", None) in kinds
    assert ("thermal", "n1-gpu0", None) in kinds
    assert len({e["id"] for e in got}) == len(got)
    t = agent.telemetry
    assert t.xid_counts == {(1, 31): 2, (3, 79): 1} and t.last_xid == {1: 31, 3: 79}
    assert t.fast[3] is not None and t.fast[3].lost
    assert t.events["xid"] == 3 and t.collector_errors == {}


def test_an_event_is_spooled_with_the_id_it_was_made_with(tmp_path: Path) -> None:
    """An id is made once, with the event (decision 0129): the runner's naming (``gpu``, ``pci``, ``source``)
    keeps it and the spool keeps the event as it was emitted, so every resend from the spool is that event."""
    stop = threading.Event()
    holder: dict[str, SimDevice] = {}
    clock = StopAt(70.0, stop, at={10.0: lambda: holder["d"].add_ecc(0, dbe=1),
                                   40.0: lambda: holder["d"].thermal_excursion(0, 96.0)})
    dev = holder["d"] = SimDevice(1, clock=clock)
    spool, emitted = Spool(tmp_path / "s.db"), list[HealthEvent]()
    agent = Agent("n1", dev, clock, spool=spool, on_events=emitted.extend)
    agent.open()
    agent.run(stop)
    spooled = [to_wire(EventIn.model_validate(json.loads(b)).to_domain()) for _, b in spool.peek(100)]
    assert {e.kind for e in emitted} >= {EventKind.ECC_DBE, EventKind.THERMAL}
    assert spooled == [to_wire(e) for e in emitted]


def test_gpu_lost_mid_poll_never_crashes() -> None:
    clock = FakeClock()
    dev, _, lib = nvml_over_sim(4, clock=clock)
    agent = Agent("n1", dev, clock)
    assert agent.open().ok
    lib.lose_after(1, 3)  # GPU 1 answers 3 calls of the next read, then GPU_IS_LOST
    evs = agent.tick()
    t = agent.telemetry
    r = t.fast[1]
    assert r is not None and r.lost and r.util_gpu_pct is not None  # what was read before the loss is kept
    assert [e.kind for e in evs] == [EventKind.GPU_LOST] and evs[0].component == "n1-gpu1"
    assert all(t.fast[i] is not None and not t.fast[i].lost for i in (0, 2, 3))  # type: ignore[union-attr]
    clock.advance(30)
    assert agent.tick() == []
    assert t.slow[1] is not None and t.slow[1].lost and t.collector_errors == {}


_CODES = [
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_UNKNOWN,
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_TIMEOUT,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_CORRUPTED_INFOROM,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
]
_FNS = [
    n
    for n in dir(FakeNvml)
    if n.startswith("nvmlDeviceGet") and n not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex")
] + ["nvmlEventSetWait_v2"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_FNS), st.sampled_from(_CODES), st.one_of(st.none(), st.integers(0, 2))),
        max_size=6,
    )
)
def test_any_nvml_error_is_data(faults: list[tuple[str, int, int | None]]) -> None:
    clock = FakeClock()
    dev, sim, lib = nvml_over_sim(3, clock=clock)
    agent = Agent("n1", dev, clock)
    agent.open()
    for fn, code, idx in faults:
        lib.fail(fn, code, idx)
    sim.inject_xid(0, 31)
    for _ in range(3):
        agent.tick()
        agent.handle_xids(dev.wait_xids(0.0))
        clock.advance(30)
    t = agent.telemetry
    assert t.collector_errors == {}
    assert all(r is not None for r in t.fast) and all(r is not None for r in t.slow)


def test_no_driver_agent_keeps_running_other_collectors() -> None:
    clock = FakeClock()
    dev, _, _ = nvml_over_sim(2, clock=clock, init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    agent = Agent("n1", dev, clock, ib=InfinibandCollector(FIX / "h100-healthy"))
    status = agent.open()
    assert not status.ok and "no NVIDIA driver" in status.message
    agent.tick()
    t = agent.telemetry
    assert not t.device_up and t.gpus == () and len(t.ib) == 8


def test_a_broken_collector_is_counted_and_skipped(tmp_path: Path) -> None:
    class Broken(InfinibandCollector):
        def read(self):  # type: ignore[no-untyped-def]
            raise RuntimeError("sysfs went away")

    clock = FakeClock()
    agent = Agent("n1", SimDevice(1, clock=clock), clock, ib=Broken(tmp_path))
    agent.open()
    for _ in range(3):
        agent.tick()
        clock.advance(1)
    assert agent.telemetry.collector_errors == {"infiniband": 3}
    assert agent.telemetry.fast[0] is not None


def test_ib_fault_in_sysfs_reaches_the_spool(tmp_path: Path) -> None:
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy", root)
    clock = FakeClock()
    spool = Spool(tmp_path / "s.db")
    agent = Agent("n1", SimDevice(0, clock=clock), clock, ib=InfinibandCollector(root), spool=spool)
    agent.open()
    agent.tick()
    (root / "mlx5_3/ports/1/state").write_text("1: DOWN\n")
    clock.advance(1)
    agent.tick()
    [(_, body)] = spool.peek(10)
    assert json.loads(body)["kind"] == "link_down" and json.loads(body)["component"] == "n1-nic3"


def test_kmsg_position_commits_after_spooling(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("b1\n")
    (proc / "stat").write_text("btime 1795000000\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("4,7,1000000,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n")

    def decode(msg: str) -> list[HealthEvent]:
        if "Xid" not in msg:
            return []
        return [HealthEvent(id="?", node="?", kind=EventKind.XID, time=FakeClock().now(), code=79, message=msg)]

    clock = FakeClock()
    spool = Spool(tmp_path / "s.db")
    follower = KmsgFollower("n1", decode, clock=clock, kmsg_path=kmsg, state_path=tmp_path / "pos.json", proc_root=proc)
    agent = Agent("n1", SimDevice(1, clock=clock), clock, kmsg=follower, spool=spool)
    agent.open()
    agent.tick()
    assert [json.loads(b)["id"] for _, b in spool.peek(10)] == ["n1:kmsg:b1:7:0"]
    assert json.loads((tmp_path / "pos.json").read_text())["kmsg_seq"] == 7
    agent.close()


def test_failing_xid_wait_does_not_spin() -> None:
    """If the device's wait fails, the loop sleeps on the clock instead (bounded ticks, errors counted)."""

    class BadWait(SimDevice):
        def wait_xids(self, timeout_s: float):  # type: ignore[no-untyped-def]
            raise RuntimeError("event set broken")

    stop = threading.Event()
    clock = StopAt(10.0, stop)
    agent = Agent("n1", BadWait(1, clock=clock), clock)
    agent.open()
    agent.run(stop)
    assert agent.telemetry.ticks == 10
    assert agent.telemetry.collector_errors["xid"] == 10


def _one_slow_tick(dev: SimDevice, spool: Spool, boot: str = "b1", *, ib: Path | None = None,
                   repaired: bool = False) -> list[HealthEvent]:
    """A fresh agent process on the same machine and state directory (booted as ``boot``): its first tick
    (``repaired``: and a second, after a repair command worked)."""
    clock = FakeClock()
    agent = Agent("n1", dev, clock, spool=spool, boot_id=lambda: boot,
                  ib=InfinibandCollector(ib) if ib is not None else None)
    agent.open()
    events = agent.tick()
    if repaired:
        agent.rearm()
        clock.advance(agent.cadence.slow_s)
        events = agent.tick()
    return events


def _kinds(events: list[HealthEvent]) -> list[EventKind]:
    return sorted(e.kind for e in events)


def test_a_restarted_agent_does_not_report_a_condition_that_still_stands(tmp_path: Path) -> None:
    """Decision 0132: the failure was reported by the last run; a new id for it would drain again a node an
    operator had put back in service, at every agent restart."""
    dev = SimDevice(2, clock=FakeClock())
    dev.set_row_remap(1, failure=True)
    dev.retire_pages(0, dbe=70, pending=False)
    first = _one_slow_tick(dev, Spool(tmp_path / "s.db"))
    assert _kinds(first) == [EventKind.ECC_DBE, EventKind.ROW_REMAP_FAILURE], first
    assert _one_slow_tick(dev, Spool(tmp_path / "s.db")) == [], "still standing: not reported again"
    dev.set_row_remap(1, failure=False)  # the condition cleared while the agent ran ...
    assert _one_slow_tick(dev, Spool(tmp_path / "s.db")) == []
    dev.set_row_remap(1, failure=True)  # ... and came back after a restart: that is news
    (again,) = _one_slow_tick(dev, Spool(tmp_path / "s.db"))
    assert again.kind == EventKind.ROW_REMAP_FAILURE and again.component == "n1-gpu1"


def test_after_a_reboot_or_a_repair_a_condition_that_still_stands_is_reported_again(tmp_path: Path) -> None:
    """A review's case: the repair ladder's reboot (or a GPU reset in place) did not fix it; kept silent,
    the node would pass a validation that does not look at it and run jobs with the fault."""
    dev = SimDevice(1, clock=FakeClock())
    dev.set_row_remap(0, failure=True)
    assert _kinds(_one_slow_tick(dev, Spool(tmp_path / "s.db"))) == [EventKind.ROW_REMAP_FAILURE]
    assert _kinds(_one_slow_tick(dev, Spool(tmp_path / "s.db"), "b2")) == [EventKind.ROW_REMAP_FAILURE]
    assert _one_slow_tick(dev, Spool(tmp_path / "s.db"), "b2") == []  # a restart on that boot keeps it
    assert _kinds(_one_slow_tick(dev, Spool(tmp_path / "s.db"), "b2", repaired=True)) == [
        EventKind.ROW_REMAP_FAILURE]
    assert _one_slow_tick(dev, Spool(tmp_path / "s.db"), "b2") == [], "the re-report is kept in turn"


def test_a_board_swapped_while_the_agent_was_stopped_reports_its_own_fault(tmp_path: Path) -> None:
    old = SimDevice(2, clock=FakeClock(), serials=["OLD-0", "OLD-1"])
    old.degrade_pcie(1, width=8)
    assert [e.component for e in _one_slow_tick(old, Spool(tmp_path / "s.db"))] == ["n1-gpu1"]
    new = SimDevice(2, clock=FakeClock(), serials=["OLD-0", "NEW-1"])  # RMA'd board, same slot, same boot
    new.degrade_pcie(1, width=8)
    assert [e.component for e in _one_slow_tick(new, Spool(tmp_path / "s.db"))] == ["n1-gpu1"]


def test_ports_still_training_after_a_reboot_are_not_reported_down(tmp_path: Path) -> None:
    """A review's case: kept across a reboot, the memory of a port seen up made every port the subnet
    manager had not armed yet (INIT) a link down: a drain at every reboot. On the same boot that memory is
    what it should be: a port that went down while the agent was stopped is reported."""
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy", root)
    states = sorted(root.glob("*/ports/*/state"))

    def downs(boot: str) -> list[str]:
        got = _one_slow_tick(SimDevice(1, clock=FakeClock()), Spool(tmp_path / "s.db"), boot, ib=root)
        return [e.attr("device") for e in got if e.kind == EventKind.LINK_DOWN]

    assert downs("b1") == []
    states[0].write_text("1: DOWN\n")  # went down while the agent was stopped (no reboot)
    assert downs("b1") == [states[0].parent.parent.parent.name]
    for state in states:  # rebooted: the agent starts before the subnet manager arms the ports
        state.write_text("2: INIT\n")
    assert downs("b2") == []


def test_a_port_still_down_after_a_repair_that_worked_is_reported_again(tmp_path: Path) -> None:
    """A GPU reset that worked does not bring an InfiniBand port back: the port, seen up on this boot and
    still down, is reported again (decision 0132's re-arm). Forgetting that it was seen up, as a reboot
    does, would keep it silent and let the node back into service on a validation that never used it."""
    root = tmp_path / "ib"
    shutil.copytree(FIX / "h100-healthy", root)
    state = sorted(root.glob("*/ports/*/state"))[0]
    device = state.parent.parent.parent.name

    def downs(*, repaired: bool = False) -> list[str]:
        got = _one_slow_tick(SimDevice(1, clock=FakeClock()), Spool(tmp_path / "s.db"), "b1", ib=root,
                             repaired=repaired)
        return [e.attr("device") for e in got if e.kind == EventKind.LINK_DOWN]

    assert downs() == []
    state.write_text("1: DOWN\n")
    assert downs() == [device]
    assert downs() == [], "a restart on the same boot keeps it"
    assert downs(repaired=True) == [device]
    state.write_text("4: ACTIVE\n")
    assert downs(repaired=True) == [], "back up: nothing to report"


def test_nvlinks_still_training_after_a_gpu_reset_that_worked_are_not_reported_down() -> None:
    """A review's case: a GPU reset tears the GPU's NVLinks down and they train again; kept, the memory of
    links seen up made every link read inside that window a link down, right after a repair that worked."""
    clock = FakeClock()
    dev = SimDevice(1, clock=clock)
    agent = Agent("n1", dev, clock)
    agent.open()
    agent.tick()  # links seen up on this boot
    dev.reset()
    for link in range(len(dev.state[0].links)):
        dev.nvlink_down(0, link)  # still training when the next slow tick reads them
    agent.rearm()
    clock.advance(agent.cadence.slow_s)
    assert [e for e in agent.tick() if e.kind == EventKind.LINK_DOWN] == []


def test_without_a_boot_id_or_a_spool_nothing_is_kept(tmp_path: Path) -> None:
    dev = SimDevice(1, clock=FakeClock())
    dev.set_row_remap(0, failure=True)
    for _ in range(2):
        assert _kinds(_one_slow_tick(dev, Spool(tmp_path / "s.db"), "")) == [EventKind.ROW_REMAP_FAILURE]
        agent = Agent("n1", dev, FakeClock(), boot_id=lambda: "b1")
        agent.open()
        assert _kinds(agent.tick()) == [EventKind.ROW_REMAP_FAILURE]
