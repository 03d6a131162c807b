"""The seam between the kernel-log follower and the diagnose decoder.

:class:`DiagnoseDecoder` wraps ``gpufleet.diagnose``'s stateful :class:`Decoder` (multi-line events,
catalog judgement) as the follower's :class:`~gpufleet.agent.collectors.kmsg.LogDecoder`: each kernel
message is fed with its kmsg sequence number as the line number, so a finding's ``line`` is the record
where the event *starts*, which the follower turns into a deterministic event id. PCI addresses map to
GPU slot names (``<node>-gpu<i>``) from the device's inventory.

:func:`default_decoder` returns that decoder, or ``None`` when the diagnose package is not installed;
the agent then runs without the kernel-log follower and says so in its log and in
``gpufleet_agent_kmsg_source{source="none"}``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpufleet.agent.collectors.kmsg import LogDecoder
from gpufleet.domain.events import HealthEvent

log = logging.getLogger(__name__)


class DiagnoseDecoder:
    def __init__(self, node: str, gpu_slots: Mapping[str, str] | None = None) -> None:
        dec_mod: Any = importlib.import_module("gpufleet.diagnose.decoder")
        ev_mod: Any = importlib.import_module("gpufleet.diagnose.events")
        cat_mod: Any = importlib.import_module("gpufleet.domain.catalog")
        self._decoder: Any = dec_mod.Decoder(cat_mod.load_default_catalog())
        self._to_event: Any = ev_mod.finding_to_event
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

    def _events(self, findings: list[Any], when: datetime | None) -> list[tuple[int, HealthEvent]]:
        out: list[tuple[int, HealthEvent]] = []
        for f in findings:
            start = int(f.line)
            ev = self._to_event(
                f,
                self.node,
                id=f"{self.node}:pending:{start}",
                gpu_slot=self.slots.get(f.pci or ""),
                fallback_time=self._when.get(start, when),
            )
            if ev is not None:
                out.append((start, ev))
        return out


def default_decoder(node: str, gpu_slots: Mapping[str, str] | None = None) -> LogDecoder | None:
    """The diagnose decoder for ``node``, or None (logged) when gpufleet.diagnose is unavailable."""
    try:
        return DiagnoseDecoder(node, gpu_slots)
    except (ImportError, AttributeError) as err:
        log.warning("kernel-log decoder unavailable (%s); the kernel-log follower is off", err)
        return None
