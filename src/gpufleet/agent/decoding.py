"""The kernel-log follower's default decoder: ``gpufleet.diagnose``.

:class:`DiagnoseDecoder` wraps the diagnose package's stateful :class:`~gpufleet.diagnose.decoder.Decoder`
(multi-line events) as the follower's
:class:`~gpufleet.agent.collectors.kmsg.LogDecoder`. Each kernel message is fed with its kmsg sequence
number as the line number, so a finding's ``line`` is the record where the event *starts*, which the
follower turns into a deterministic event id. PCI addresses map to GPU slot names (``<node>-gpu<i>``)
from the device's inventory; an address with no slot keeps the PCI address as the component (the
controller maps it to the node). An SXid's switch port is mapped to the GPU on its far end when the
agent has the node's ``nvidia-smi nvlink -R`` (``nvlink_remote_file``). It decodes WITHOUT a catalog:
the agent reports observations and the controller judges them once with the site's catalog
(``domain/judgement.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.events import finding_to_event
from gpufleet.diagnose.finding import Finding
from gpufleet.diagnose.nvlink_remote import SwitchPorts
from gpufleet.domain.events import HealthEvent


class DiagnoseDecoder:
    def __init__(self, node: str, gpu_slots: Mapping[str, str] | None = None,
                 switch_ports: SwitchPorts | None = None) -> None:
        self._decoder = Decoder(None, switch_ports=switch_ports)
        self.node = node
        self.slots = dict(gpu_slots or {})
        self._when: dict[int, datetime] = {}

    def feed(self, message: str, seq: int, when: datetime) -> list[tuple[int, HealthEvent]]:
        self._when[seq] = when
        return self._events(self._decoder.feed(message, lineno=seq), when)

    def flush(self) -> list[tuple[int, HealthEvent]]:
        out = self._events(self._decoder.flush(), None)
        self._when.clear()
        return out

    @property
    def undecoded(self) -> int:
        return self._decoder.stats.undecoded

    def _events(self, findings: Iterable[Finding], when: datetime | None) -> list[tuple[int, HealthEvent]]:
        out: list[tuple[int, HealthEvent]] = []
        for f in findings:
            start = f.line
            ev = finding_to_event(
                f,
                self.node,
                id=f"{self.node}:pending:{start}",
                gpu_slot=self.slots.get(f.pci or ""),
                fallback_time=self._when.get(start, when),
                source="kmsg",
            )
            if ev is not None:
                out.append((start, ev))
        return out


def default_decoder(node: str, gpu_slots: Mapping[str, str] | None = None,
                    switch_ports: SwitchPorts | None = None) -> DiagnoseDecoder:
    """The diagnose decoder for ``node`` (unjudged: observations only); ``switch_ports`` from the
    ``nvlink_remote_file`` setting names the GPU behind an SXid's switch port."""
    return DiagnoseDecoder(node, gpu_slots, switch_ports)
