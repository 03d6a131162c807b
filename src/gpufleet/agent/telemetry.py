"""The agent's latest readings: written by the runner, read by the exporter at scrape time.

The runner replaces whole readings (one reference assignment each), so a scrape on the HTTP thread sees
either the old or the new reading of a GPU, never half of one. Nothing here is copied per tick.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.agent.collectors.host import HostReading
from gpufleet.agent.collectors.infiniband import IbPortReading
from gpufleet.agent.devices.port import FastReading, GpuInfo, SlowReading


@dataclass(slots=True)
class Telemetry:
    hostname: str
    device: str = ""
    device_up: bool = False
    device_message: str = ""
    driver_version: str = ""
    gpus: tuple[GpuInfo, ...] = ()
    fast: list[FastReading | None] = field(default_factory=list)
    slow: list[SlowReading | None] = field(default_factory=list)
    xid_counts: dict[tuple[int, int], int] = field(default_factory=dict)  # (gpu index, xid) -> events
    last_xid: dict[int, int] = field(default_factory=dict)
    ib: list[IbPortReading] = field(default_factory=list)
    host: HostReading | None = None
    events: dict[str, int] = field(default_factory=dict)  # kind -> health events raised
    collector_errors: dict[str, int] = field(default_factory=dict)  # collector -> unexpected failures
    kmsg_source: str = "none"
    kmsg_lines: int = 0
    kmsg_undecoded: int = 0  # lines naming an Xid/SXid the decoder could not read
    ticks: int = 0
    idle_gpu: dict[tuple[int, str], float] = field(default_factory=dict)  # (gpu index, job) -> idle seconds
    idle_gpu_user: dict[tuple[int, str], str] = field(default_factory=dict)  # (gpu index, job) -> the job's owner

    def set_gpus(self, gpus: tuple[GpuInfo, ...]) -> None:
        self.gpus = gpus
        self.fast = [None] * len(gpus)
        self.slow = [None] * len(gpus)

    def count_xid(self, index: int, code: int) -> None:
        key = (index, code)
        self.xid_counts[key] = self.xid_counts.get(key, 0) + 1
        self.last_xid[index] = code
