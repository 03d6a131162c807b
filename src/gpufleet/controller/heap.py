"""Keeping the cycle collector's pauses short in a controller with a large fleet in memory.

CPython's full (generation 2) collection walks every tracked object. A controller that has loaded its
modules, the web stack and 12,500 node records holds about 150,000 of them, and walking them took
65-145 ms on the 2-core reference box: every request arriving meanwhile waited, which was the p99 of
event ingest. Those objects live as long as the process, so after start-up and after a bulk
registration we collect once and move every object alive into the permanent generation
(``gc.freeze``), which later collections skip. What the controller keeps per event afterwards (the
policy's sightings: tuples of a time, a kind and a code) is untracked by CPython itself, so the tracked
heap stays small as evidence accumulates.

The cost: cyclic garbage among frozen objects is never collected (plain reference counting still
frees everything else). Frozen objects are the long-lived ones, so nothing grows from it.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

SETTLE_AFTER_NODES = 1000  # a registration at least this large settles the heap


def settle(why: str) -> None:
    """Collect once, then exclude every surviving object from later collections."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("heap settled after %s: %d objects frozen in %.0f ms", why, gc.get_freeze_count(),
             1000 * (time.perf_counter() - t0))
