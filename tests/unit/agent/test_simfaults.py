"""``--inject SPEC``: the parser, and simulated faults reaching events through the agent's real collectors
and rules (a simulated sysfs tree, a simulated kernel ring, the simulated device's readings)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.agent.app import run_agent
from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.collectors.kmsg import KmsgFollower
from gpufleet.agent.config import load_config
from gpufleet.agent.decoding import default_decoder
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.devices.simfaults import Fault, FaultInjector, parse_fault
from gpufleet.agent.devices.simhost import SimKernelLog, SimSysfs
from gpufleet.agent.runner import Agent, Cadence
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent

BTIME = 1_795_000_000


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("xid:94@gpu1", Fault("xid:94@gpu1", "xid", 94, gpu=1)),
        ("ecc_dbe@gpu0", Fault("ecc_dbe@gpu0", "ecc_dbe", 1, gpu=0)),
        ("ecc_sbe:120@gpu3", Fault("ecc_sbe:120@gpu3", "ecc_sbe", 120, gpu=3)),
        ("gpu_lost@gpu3", Fault("gpu_lost@gpu3", "gpu_lost", None, gpu=3)),
        ("thermal@gpu2", Fault("thermal@gpu2", "thermal", 94, gpu=2)),
        ("nvlink_errors:40@gpu2", Fault("nvlink_errors:40@gpu2", "nvlink_errors", 40, gpu=2)),
        ("nvlink_errors:40@gpu2.nvlink7", Fault("nvlink_errors:40@gpu2.nvlink7", "nvlink_errors", 40, 2, 7)),
        ("nvlink_down@gpu0.nvlink3", Fault("nvlink_down@gpu0.nvlink3", "nvlink_down", None, 0, 3)),
        ("ib_down@nic5", Fault("ib_down@nic5", "ib_down", None, nic=5)),
        ("ib_flap:3@nic0@+12.5", Fault("ib_flap:3@nic0@+12.5", "ib_flap", 3, nic=0, delay_s=12.5)),
        ("xid:79@pci=0000:9f:00.0", Fault("xid:79@pci=0000:9f:00.0", "xid", 79, pci="0000:9f:00.0")),
        ("xid:48@gpu0@+30", Fault("xid:48@gpu0@+30", "xid", 48, gpu=0, delay_s=30.0)),
    ],
)
def test_parse(spec: str, fault: Fault) -> None:
    assert parse_fault(spec) == fault


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("xid:94", "separated by '@'"),
        ("xid:94@gpu1@+5@x", "separated by '@'"),
        ("@gpu1", "separated by '@'"),
        ("ecc@gpu0", "a kind among xid, ecc_dbe"),
        ("xid@gpu1", "xid:CODE (CODE is required)"),
        ("xid:x94@gpu1", "xid:CODE with CODE a whole number"),
        ("xid:-1@gpu1", "xid:CODE with CODE a whole number"),
        ("gpu_lost:2@gpu1", "no ARG for gpu_lost"),
        ("ecc_sbe:0@gpu1", "ecc_sbe:COUNT of 1 or more"),
        ("ecc_dbe@gpu", "a target gpuI, gpuI.nvlinkN, nicK or pci=dddd:bb:dd.f"),
        ("xid:94@pci=18:00.0", "a target gpuI"),
        ("ib_down@gpu1", "ib_down at nicK"),
        ("nvlink_down@gpu1", "nvlink_down at gpuI.nvlinkN"),
        ("ecc_dbe@pci=0000:18:00.0", "ecc_dbe at gpuI"),
        ("xid:94@gpu1@5", "a delay +SECONDS"),
    ],
)
def test_parse_errors_name_inject_the_value_and_the_grammar(spec: str, says: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_fault(spec)
    assert err.value.field == "--inject" and err.value.value == spec
    assert says in err.value.expected and "KIND[:ARG]@TARGET[@+SECONDS]" in err.value.expected


@dataclass
class Node:
    agent: Agent
    device: SimDevice
    sysfs: SimSysfs
    kernel_log: SimKernelLog
    inject: FaultInjector
    clock: FakeClock
    events: list[HealthEvent]

    def step(self, seconds: float) -> list[HealthEvent]:
        """Advance the clock, tick, then hand over the XIDs the device queued (as the run loop does)."""
        start = len(self.events)
        self.clock.advance(seconds)
        self.agent.tick()
        self.agent.handle_xids(self.device.wait_xids(0))
        return self.events[start:]


def sim_node(tmp_path: Path, *specs: str, gpus: int = 4, nics: int = 4) -> Node:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("b00t\n")
    (proc / "stat").write_text(f"btime {BTIME}\n")
    clock = FakeClock()
    klog = SimKernelLog(tmp_path / "kmsg", clock, datetime.fromtimestamp(BTIME, UTC))
    sysfs = SimSysfs(tmp_path / "sys", nics=nics, serial="TRAY1")
    dev = SimDevice(gpus, clock=clock, kernel_log=klog)
    dev.open()
    slots = {g.pci_bus_id: f"n1-gpu{g.index}" for g in dev.gpus()}
    follower = KmsgFollower("n1", default_decoder("n1", slots), clock=clock, kmsg_path=klog.path, proc_root=proc)
    inj = FaultInjector([parse_fault(s) for s in specs], clock, device=dev, sysfs=sysfs, kernel_log=klog)
    events: list[HealthEvent] = []
    agent = Agent(
        "n1",
        dev,
        clock,
        cadence=Cadence(fast_s=1, slow_s=30, ib_s=1, host_s=30),
        ib=InfinibandCollector(sysfs.ib_root),
        kmsg=follower,
        on_events=events.extend,
        inject=inj,
    )
    agent.open()
    assert agent.tick() == []  # the baseline readings: nothing wrong yet; due faults fire after them
    return Node(agent, dev, sysfs, klog, inj, clock, events)


def test_xid_with_a_simulated_kernel_log_is_seen_by_nvml_and_by_the_kernel_log(tmp_path: Path) -> None:
    node = sim_node(tmp_path, "xid:94@gpu1")
    first = [e for e in node.step(0) if e.kind is EventKind.XID]  # NVML: the run loop's wait returns it
    later = [e for e in node.step(1) if e.kind is EventKind.XID]  # the kernel log: read at the next tick
    assert [e.source for e in first] == ["nvml"] and [e.source for e in later] == ["kmsg"]
    nvml, kmsg = first[0], later[0]
    for e in (nvml, kmsg):
        attrs = dict(e.attrs)
        assert (e.code, e.component, attrs["gpu"], attrs["pci"]) == (94, "n1-gpu1", "1", "0000:2a:00.0")
    assert kmsg.time == nvml.time == node.clock.now() - timedelta(seconds=1)  # one fault, one time
    line = node.kernel_log.path.read_text().splitlines()[-1]
    assert line.endswith(
        ";NVRM: Xid (PCI:0000:2a:00): 94, pid=4242, name=python3, Contained: CE User Channel (0x1). RST: No, D-RST: No"
    )
    assert node.step(1) == []


def test_xid_at_an_address_the_node_does_not_know_is_reported_against_the_node(tmp_path: Path) -> None:
    node = sim_node(tmp_path, "xid:79@pci=0000:9f:00.0")
    assert node.step(0) == []  # NVML knows no such GPU
    [ev] = [e for e in node.step(1) if e.kind is EventKind.XID]
    assert (ev.component, ev.code, ev.source) == ("n1", 79, "kmsg")
    assert dict(ev.attrs)["pci"] == "0000:9f:00.0" and "gpu" not in dict(ev.attrs)


@pytest.mark.parametrize(
    ("spec", "wait", "kind", "component", "attrs"),
    [
        ("ecc_dbe@gpu0", 30, EventKind.ECC_DBE, "n1-gpu0", {"gpu": "0", "pci": "0000:18:00.0"}),
        ("ecc_sbe:150@gpu2", 30, EventKind.ECC_SBE, "n1-gpu2", {"gpu": "2"}),
        ("thermal@gpu3", 1, EventKind.THERMAL, "n1-gpu3", {"gpu": "3"}),
        ("gpu_lost@gpu1", 1, EventKind.GPU_LOST, "n1-gpu1", {"gpu": "1", "pci": "0000:2a:00.0"}),
        ("nvlink_down@gpu0.nvlink3", 30, EventKind.LINK_DOWN, "n1-gpu0", {"gpu": "0", "nvlink": "3"}),
        ("nvlink_errors:150@gpu1.nvlink2", 30, EventKind.LINK_ERROR, "n1-gpu1", {"gpu": "1", "nvlink": "2"}),
        ("ib_down@nic3", 1, EventKind.LINK_DOWN, "n1-nic3", {"device": "mlx5_3", "port": "1"}),
        ("ib_flap:2@nic1", 1, EventKind.LINK_FLAP, "n1-nic1", {"device": "mlx5_1", "port": "1"}),
        # below the rules' limits: weak reports (agent/weaklinks.py)
        ("nvlink_errors:1@gpu2.nvlink5", 30, EventKind.LINK_ERROR, "n1-gpu2",
         {"gpu": "2", "nvlink": "5", "rule": "nvlink_error_seen", "errors": "1"}),
        ("ib_symbol:3@nic2", 1, EventKind.LINK_ERROR, "n1-nic2",
         {"device": "mlx5_2", "port": "1", "rule": "ib_symbol_error_seen", "errors": "3"}),
        ("ib_rcv:2@nic0", 1, EventKind.LINK_ERROR, "n1-nic0",
         {"device": "mlx5_0", "rule": "ib_port_rcv_error_seen", "errors": "2"}),
    ],
)
def test_fault_reaches_the_rules_through_the_real_collectors(
    tmp_path: Path, spec: str, wait: float, kind: EventKind, component: str, attrs: dict[str, str]
) -> None:
    node = sim_node(tmp_path, spec)
    found = [e for e in node.step(wait) if e.kind is kind and e.source != "kmsg"]
    assert found, node.events
    for ev in found:  # thermal@ raises the core and the HBM excursion
        assert ev.component == component and attrs.items() <= dict(ev.attrs).items()
        assert ev.source == ("infiniband" if component.startswith("n1-nic") else "nvml")


def test_ib_down_writes_the_port_files_the_collector_reads(tmp_path: Path) -> None:
    node = sim_node(tmp_path, "ib_down@nic2")
    port = node.sysfs.ib_root / "mlx5_2" / "ports" / "1"
    assert (port / "state").read_text() == "1: DOWN\n" and (port / "phys_state").read_text() == "3: Disabled\n"


def test_delay_counts_on_the_agents_clock(tmp_path: Path) -> None:
    node = sim_node(tmp_path, "ecc_dbe@gpu0@+60")
    assert node.step(30) == [] and node.inject.fired == []
    assert node.step(30) == [] and [f.spec for f in node.inject.fired] == ["ecc_dbe@gpu0@+60"]
    assert [e.kind for e in node.step(30)] == [EventKind.ECC_DBE, EventKind.ROW_REMAP_PENDING]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("xid:94@gpu4", "a GPU index below 4"),
        ("nvlink_down@gpu0.nvlink18", "an NVLink index below 18"),
        ("ib_down@nic4", "a NIC index below 4"),
    ],
)
def test_targets_are_checked_against_the_node(tmp_path: Path, spec: str, says: str) -> None:
    with pytest.raises(InvalidInput) as err:
        sim_node(tmp_path, spec)
    assert err.value.field == "--inject" and err.value.value == spec and says in err.value.expected


def test_faults_needing_a_simulated_surface_say_so(tmp_path: Path) -> None:
    dev = SimDevice(2, clock=FakeClock())
    with pytest.raises(InvalidInput, match="leave --ib-root unset"):
        FaultInjector([parse_fault("ib_down@nic0")], FakeClock(), device=dev)
    with pytest.raises(InvalidInput, match="--kmsg-path FILE"):
        FaultInjector([parse_fault("xid:79@pci=0000:9f:00.0")], FakeClock(), device=dev)


def test_simulated_kernel_log_continues_the_files_sequence(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("6,41,5000000,-;earlier boot message\n SUBSYSTEM=pci\n")
    clock = FakeClock()
    klog = SimKernelLog(path, clock, clock.now() - timedelta(seconds=10))
    klog.xid("0000:18:00.0", 13)
    assert path.read_text().splitlines()[-1].startswith("4,42,10000000,-;NVRM: Xid (PCI:0000:18:00): 13, ")


class _StopAt(FakeClock):
    def __init__(self, until: float, stop: threading.Event) -> None:
        super().__init__()
        self.until, self.stop = until, stop

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        if self.monotonic() >= self.until:
            self.stop.set()


def test_run_agent_wires_the_simulated_node(tmp_path: Path) -> None:
    """``gpufleet agent --device sim --kmsg-path FILE --inject ...`` as wired by run_agent, on a fake clock."""
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("b00t\n")
    (proc / "stat").write_text(f"btime {BTIME}\n")
    cfg = load_config(
        None,
        node="n1",
        device="sim",
        gpus=2,
        sim_nics=3,
        push=False,
        state_dir=tmp_path / "state",
        kmsg_path=tmp_path / "kmsg",
        proc_root=proc,
        metrics_port=0,
        metrics_addr="127.0.0.1",
        inject=["xid:94@gpu1", "ib_flap@nic2@+5"],
    )
    stop = threading.Event()
    agent = run_agent(cfg, stop, clock=_StopAt(10.0, stop))
    t = agent.telemetry
    assert t.kmsg_source == "kmsg" and t.events == {"xid": 2, "link_flap": 1}
    assert "NVRM: Xid (PCI:0000:2a:00): 94" in (tmp_path / "kmsg").read_text()
    assert [p.device for p in t.ib] == ["mlx5_0", "mlx5_1", "mlx5_2"]
