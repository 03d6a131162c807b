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

Young collections: CPython runs one every 700 net allocations of tracked objects, and an object alive
at two of them is promoted to the oldest generation, whose growth by a quarter triggers a full
collection. The correlation engine keeps its window's symptoms and candidates for minutes and makes
short-lived tuples and lists per event, so at the default every few hundred events promoted a crop of
objects that were about to die, and full collections followed. :func:`tune` runs young collections
every :data:`YOUNG` allocations instead: most short-lived objects are gone by then (a young collection
of 10,000 objects takes well under a millisecond). Measured on 131,072 GPUs (docs/benchmarks.md,
§correlate): the engine with coherence 12-20 % faster over the benchmark's 18 streams (25-45 % on four
of them); 5,000-20,000 all did about as well, 50,000 less; event ingest's p99 went down too (about
halved at the fixed load).
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

SETTLE_AFTER_NODES = 1000  # a registration at least this large settles the heap
YOUNG = 10_000  # net tracked allocations between young collections (CPython's default: 700)


def tune() -> None:
    """The controller's collector thresholds: young collections every :data:`YOUNG` allocations, the
    older generations' counts as CPython sets them."""
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)


def settle(why: str) -> None:
    """Collect once, then exclude every surviving object from later collections."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info("heap settled after %s: %d objects frozen in %.0f ms", why, gc.get_freeze_count(),
             1000 * (time.perf_counter() - t0))
