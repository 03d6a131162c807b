"""The seam between the kernel-log follower and the diagnose decoder.

:func:`default_decoder` returns ``decode(message) -> list[HealthEvent]`` built on
``gpufleet.diagnose`` when that package provides its decoder, else ``None`` (the agent then runs without
the kernel-log follower and says so in its log and in ``gpufleet_agent_kmsg_source{source="none"}``).
Any ``Callable[[str], Iterable[HealthEvent]]`` can be passed to :class:`KmsgFollower` instead.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpufleet.domain.events import HealthEvent

log = logging.getLogger(__name__)


def default_decoder(
    node: str, gpu_slots: Mapping[str, str] | None = None
) -> Callable[[str], Iterable[HealthEvent]] | None:
    """The diagnose decoder wrapped for the follower; ``gpu_slots`` maps PCI bus ids to GPU slot names."""
    try:
        dec_mod: Any = importlib.import_module("gpufleet.diagnose.decoder")
        ev_mod: Any = importlib.import_module("gpufleet.diagnose.events")
        cat_mod: Any = importlib.import_module("gpufleet.domain.catalog")
    except ImportError as err:
        log.warning("kernel-log decoder unavailable (%s); the kernel-log follower is off", err)
        return None
    catalog = cat_mod.load_catalog() if hasattr(cat_mod, "load_catalog") else None
    decoder = dec_mod.Decoder(catalog) if catalog is not None else dec_mod.Decoder()
    slots = dict(gpu_slots or {})
    counter = [0]

    def decode(message: str) -> list[HealthEvent]:
        out: list[HealthEvent] = []
        for finding in decoder.feed(message):
            counter[0] += 1
            pci = getattr(finding, "pci", None) or ""
            ev = ev_mod.finding_to_event(finding, node, id=f"pending-{counter[0]}", gpu_slot=slots.get(pci))
            if ev is not None:
                out.append(ev)
        return out

    return decode
