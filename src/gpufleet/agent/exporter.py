"""Prometheus exporter: one custom collector over :class:`~gpufleet.agent.telemetry.Telemetry`.

Names and labels follow dcgm-exporter where the fields overlap (``DCGM_FI_DEV_*`` with labels ``gpu``,
``UUID``, ``device``, ``modelName``, ``Hostname``, ``pci_bus_id``), so existing dashboards keep working.
What dcgm-exporter leaves out by default is added under ``gpufleet_*``; most importantly
``gpufleet_gpu_xid_errors_total{xid="<code>"}`` counts every XID event per code (dcgm-exporter's
``DCGM_FI_DEV_XID_ERRORS`` only holds the last XID and never resets). docs/agent.md has the mapping table.

All DCGM-named series are exported as gauges (dcgm-exporter declares some of them counters, but their
names lack the ``_total`` suffix the OpenMetrics format requires of counters; the values are NVML's own
counters either way and ``rate()``/``increase()`` work on them). The exporter has its own registry (no
global state) and builds series only when scraped: the 1 s tick costs nothing here.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpufleet import __version__
from gpufleet.agent.collectors.infiniband import COUNTERS
from gpufleet.agent.devices.port import FastReading, SlowReading, ThrottleReason
from gpufleet.agent.telemetry import Telemetry
from gpufleet.domain.errors import InvalidInput

if TYPE_CHECKING:
    from gpufleet.agent.push import Pusher
    from gpufleet.agent.spool import Spool

GPU_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id"]
MIB = 1024 * 1024

# (metric name, help, reading attribute, scale) for numeric per-GPU fields.
_FAST: tuple[tuple[str, str, str, float], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_gpu_pct", 1.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "util_mem_pct", 1.0),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "mem_used_bytes", 1 / MIB),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temp_gpu_c", 1.0),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory (HBM) temperature (in C).", "temp_hbm_c", 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1.0),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1.0),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz", 1.0),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Current clock throttle reasons (NVML bitmask).",
        "throttle_reasons",
        1.0,
    ),
)
_SLOW: tuple[tuple[str, str, str, float], ...] = (
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Single-bit (correctable) volatile ECC errors.",
        "ecc_sbe_volatile",
        1.0,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Double-bit (uncorrectable) volatile ECC errors.",
        "ecc_dbe_volatile",
        1.0,
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Single-bit (correctable) aggregate ECC errors.",
        "ecc_sbe_aggregate",
        1.0,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Double-bit (uncorrectable) aggregate ECC errors.",
        "ecc_dbe_aggregate",
        1.0,
    ),
    ("DCGM_FI_DEV_RETIRED_SBE", "Pages retired because of single-bit errors.", "retired_pages_sbe", 1.0),
    ("DCGM_FI_DEV_RETIRED_DBE", "Pages retired because of double-bit errors.", "retired_pages_dbe", 1.0),
    ("DCGM_FI_DEV_RETIRED_PENDING", "1 if a page retirement is pending.", "retired_pages_pending", 1.0),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for correctable errors.",
        "remap_correctable",
        1.0,
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for uncorrectable errors.",
        "remap_uncorrectable",
        1.0,
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "1 if a row remap is pending (applied at the next GPU reset).",
        "remap_pending",
        1.0,
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1 if row remapping has failed.", "remap_failure", 1.0),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "Current PCIe link generation.", "pcie_gen", 1.0),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "Maximum PCIe link generation.", "pcie_gen_max", 1.0),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "Current PCIe link width (lanes).", "pcie_width", 1.0),
    ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "Maximum PCIe link width (lanes).", "pcie_width_max", 1.0),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replay", 1.0),
)
_NVLINK_TOTALS = (
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "NVLink flow-control CRC errors, all links.",
        "crc_flit",
    ),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVLink data CRC errors, all links.", "crc_data"),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVLink retries, all links.", "replay"),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVLink recovery errors, all links.", "recovery"),
)


class AgentCollector:
    """A prometheus_client collector that renders the telemetry when scraped."""

    def __init__(self, telemetry: Telemetry, spool: Spool | None = None, pusher: Pusher | None = None) -> None:
        self.t = telemetry
        self.spool = spool
        self.pusher = pusher
        self._labels: list[list[str]] = []
        self._labels_for: tuple[object, ...] = ()

    def _gpu_labels(self) -> list[list[str]]:
        if self._labels_for is not self.t.gpus:
            self._labels = [
                [str(g.index), g.uuid, f"nvidia{g.index}", g.name, self.t.hostname, g.pci_bus_id] for g in self.t.gpus
            ]
            self._labels_for = self.t.gpus
        return self._labels

    def collect(self) -> Iterator[Metric]:
        yield from self._agent()
        labels = self._gpu_labels()
        fast, slow = list(self.t.fast), list(self.t.slow)
        yield from _numeric(_FAST, fast, labels)
        free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=GPU_LABELS)
        for lab, r in zip(labels, fast, strict=False):
            if r is not None and r.mem_total_bytes is not None and r.mem_used_bytes is not None:
                free.add_metric(lab, (r.mem_total_bytes - r.mem_used_bytes) / MIB)
        yield free
        yield from self._throttle(fast, labels)
        yield from _numeric(_SLOW, slow, labels)
        yield from self._nvlink(slow, labels)
        yield from self._xid(labels)
        lost = GaugeMetricFamily(
            "gpufleet_gpu_lost", "1 if the GPU is lost (GPU_IS_LOST, fell off the bus).", labels=GPU_LABELS
        )
        for lab, r in zip(labels, fast, strict=False):
            if r is not None:
                lost.add_metric(lab, 1.0 if r.lost else 0.0)
        yield lost
        idle = GaugeMetricFamily("gpufleet_gpu_idle_seconds", "Seconds a GPU allocated to a Slurm job has been "
                                 "idle (agent/idlegpu.py); absent when not allocated or busy. user: the job's "
                                 "owner, for routing a notice.", labels=[*GPU_LABELS, "job", "user"])
        for (gpu, job), seconds in sorted(self.t.idle_gpu.items()):
            if 0 <= gpu < len(labels):
                idle.add_metric([*labels[gpu], job, self.t.idle_gpu_user.get((gpu, job), "")], seconds)
        yield idle
        yield from self._ib()
        yield from self._host()

    def _agent(self) -> Iterator[Metric]:
        t = self.t
        info = GaugeMetricFamily(
            "gpufleet_agent_info",
            "Agent build and device.",
            labels=["version", "device", "driver_version", "Hostname"],
        )
        info.add_metric([__version__, t.device, t.driver_version, t.hostname], 1.0)
        yield info
        yield GaugeMetricFamily(
            "gpufleet_agent_device_up",
            "1 if the GPU library initialised (NVML or sim).",
            value=1.0 if t.device_up else 0.0,
        )
        yield GaugeMetricFamily("gpufleet_agent_gpus", "GPUs found on this node.", value=float(len(t.gpus)))
        ev = CounterMetricFamily("gpufleet_agent_events", "Health events raised by the agent.", labels=["kind"])
        for kind, n in sorted(t.events.items()):
            ev.add_metric([kind], float(n))
        yield ev
        errs = CounterMetricFamily(
            "gpufleet_agent_collector_errors",
            "Unexpected collector failures (logged; the agent kept running).",
            labels=["collector"],
        )
        for name, n in sorted(t.collector_errors.items()):
            errs.add_metric([name], float(n))
        yield errs
        src = GaugeMetricFamily("gpufleet_agent_kmsg_source", "Kernel-log source in use.", labels=["source"])
        src.add_metric([t.kmsg_source], 1.0)
        yield src
        yield CounterMetricFamily("gpufleet_agent_kmsg_lines", "Kernel-log lines read.", value=float(t.kmsg_lines))
        yield CounterMetricFamily("gpufleet_agent_kmsg_undecoded",
                                  "Kernel-log lines naming an Xid or SXid that could not be read (no or a bad "
                                  "code: a driver format to report).", value=float(t.kmsg_undecoded))
        if self.spool is not None:
            yield GaugeMetricFamily(
                "gpufleet_agent_spool_events", "Events waiting in the spool.", value=float(len(self.spool))
            )
            yield CounterMetricFamily(
                "gpufleet_agent_spool_dropped",
                "Events dropped from a full spool.",
                value=float(self.spool.dropped),
            )
        if self.pusher is not None:
            p = self.pusher
            yield CounterMetricFamily(
                "gpufleet_agent_push_events", "Events the controller accepted.", value=float(p.pushed)
            )
            yield CounterMetricFamily(
                "gpufleet_agent_push_failures", "Failed pushes and heartbeats.", value=float(p.failures)
            )
            yield GaugeMetricFamily(
                "gpufleet_agent_controller_up",
                "1 if the last push or heartbeat succeeded.",
                value=1.0 if p.controller_up else 0.0,
            )
            if p.last_success is not None:
                yield GaugeMetricFamily(
                    "gpufleet_agent_last_push_timestamp_seconds",
                    "Time of the last successful push.",
                    value=p.last_success.timestamp(),
                )

    def _throttle(self, fast: list[FastReading | None], labels: list[list[str]]) -> Iterator[Metric]:
        m = GaugeMetricFamily(
            "gpufleet_gpu_clock_throttle",
            "1 per active clock-throttle reason.",
            labels=[*GPU_LABELS, "reason"],
        )
        for lab, r in zip(labels, fast, strict=False):
            if r is None or r.throttle_reasons is None:
                continue
            for reason in ThrottleReason:
                if r.throttle_reasons & reason:
                    m.add_metric([*lab, (reason.name or "").lower()], 1.0)
        yield m

    def _nvlink(self, slow: list[SlowReading | None], labels: list[list[str]]) -> Iterator[Metric]:
        totals = [GaugeMetricFamily(n, h, labels=GPU_LABELS) for n, h, _ in _NVLINK_TOTALS]
        up = GaugeMetricFamily("gpufleet_gpu_nvlink_up", "1 if the NVLink is up.", labels=[*GPU_LABELS, "link"])
        errs = GaugeMetricFamily(
            "gpufleet_gpu_nvlink_errors",
            "NVLink error counters per link.",
            labels=[*GPU_LABELS, "link", "type"],
        )
        for lab, r in zip(labels, slow, strict=False):
            if r is None or not r.nvlinks:
                continue
            for fam, (_, _, attr) in zip(totals, _NVLINK_TOTALS, strict=True):
                vals = [getattr(lk, attr) for lk in r.nvlinks]
                if any(v is not None for v in vals):
                    fam.add_metric(lab, float(sum(v or 0 for v in vals)))
            for lk in r.nvlinks:
                if lk.up is not None:
                    up.add_metric([*lab, str(lk.link)], 1.0 if lk.up else 0.0)
                for _, _, attr in _NVLINK_TOTALS:
                    v = getattr(lk, attr)
                    if v is not None:
                        errs.add_metric([*lab, str(lk.link), attr], float(v))
        yield from totals
        yield up
        yield errs

    def _xid(self, labels: list[list[str]]) -> Iterator[Metric]:
        by_index = {int(lab[0]): lab for lab in labels}
        total = CounterMetricFamily(
            "gpufleet_gpu_xid_errors",
            "XID events per GPU and XID code (every event counts; never reset).",
            labels=[*GPU_LABELS, "xid"],
        )
        for (index, code), n in sorted(self.t.xid_counts.items()):
            lab = by_index.get(index, [str(index), "", "", "", self.t.hostname, ""])
            total.add_metric([*lab, str(code)], float(n))
        yield total
        last = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=GPU_LABELS
        )
        for lab in labels:
            last.add_metric(lab, float(self.t.last_xid.get(int(lab[0]), 0)))
        yield last

    def _ib(self) -> Iterator[Metric]:
        lab = ["device", "port", "Hostname"]
        state = GaugeMetricFamily("gpufleet_ib_port_state", "IB port logical state (4 = ACTIVE).", labels=lab)
        active = GaugeMetricFamily("gpufleet_ib_port_active", "1 if the IB port is ACTIVE.", labels=lab)
        rate = GaugeMetricFamily("gpufleet_ib_port_rate_gbps", "IB port rate (Gb/s).", labels=lab)
        counters = {
            c: GaugeMetricFamily(f"gpufleet_ib_{c}", f"IB port counter {c} (sysfs counters/{c}).", labels=lab)
            for c in COUNTERS
        }
        for p in list(self.t.ib):
            lv = [p.device, str(p.port), self.t.hostname]
            if p.state_id is not None:
                state.add_metric(lv, float(p.state_id))
            active.add_metric(lv, 1.0 if p.active else 0.0)
            if p.rate_gbps is not None:
                rate.add_metric(lv, p.rate_gbps)
            for c, v in zip(COUNTERS, p.counters, strict=True):
                if v is not None:
                    counters[c].add_metric(lv, float(v))
        yield state
        yield active
        yield rate
        yield from counters.values()

    def _host(self) -> Iterator[Metric]:
        h = self.t.host
        ce = GaugeMetricFamily(
            "gpufleet_host_edac_correctable_errors", "EDAC correctable errors.", labels=["mc", "Hostname"]
        )
        ue = GaugeMetricFamily(
            "gpufleet_host_edac_uncorrectable_errors", "EDAC uncorrectable errors.", labels=["mc", "Hostname"]
        )
        free = GaugeMetricFamily(
            "gpufleet_host_mount_free_bytes",
            "Free bytes on a watched mount.",
            labels=["role", "mount", "Hostname"],
        )
        present = GaugeMetricFamily(
            "gpufleet_host_mount_present",
            "1 if the watched mount exists.",
            labels=["role", "mount", "Hostname"],
        )
        if h is not None:
            for mc in h.edac:
                if mc.correctable is not None:
                    ce.add_metric([mc.mc, self.t.hostname], float(mc.correctable))
                if mc.uncorrectable is not None:
                    ue.add_metric([mc.mc, self.t.hostname], float(mc.uncorrectable))
            for m in h.mounts:
                present.add_metric([m.role, m.path, self.t.hostname], 1.0 if m.present else 0.0)
                if m.free_bytes is not None:
                    free.add_metric([m.role, m.path, self.t.hostname], float(m.free_bytes))
        yield ce
        yield ue
        yield free
        yield present


def _numeric(
    spec: tuple[tuple[str, str, str, float], ...],
    readings: list[FastReading | None] | list[SlowReading | None],
    labels: list[list[str]],
) -> Iterator[Metric]:
    for name, help_text, attr, scale in spec:
        fam = GaugeMetricFamily(name, help_text, labels=GPU_LABELS)
        for lab, r in zip(labels, readings, strict=False):
            if r is None or r.lost:
                continue
            v = getattr(r, attr)
            if v is not None:
                fam.add_metric(lab, float(v) * scale)
        yield fam


def make_registry(telemetry: Telemetry, spool: Spool | None = None, pusher: Pusher | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(telemetry, spool, pusher))
    return registry


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> tuple[Callable[[], None], int]:
    """Serve ``/metrics`` on ``addr:port`` in a daemon thread; returns (stop function, bound port).

    A port already taken (dcgm-exporter's default is 9400 too) or an address this host does not have is
    an InvalidInput naming the setting, not a traceback."""
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except socket.gaierror as err:
        raise InvalidInput("metrics_addr", addr, f"an IP address or host name of this node ({err.strerror})") from None
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            expected = f"a port no other process listens on at {addr} ({err.strerror}; 0 = any free port)"
            raise InvalidInput("metrics_port", port, expected) from None
        raise InvalidInput("metrics_addr", addr, f"an address of this node ({err.strerror})") from None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop, int(server.server_port)
