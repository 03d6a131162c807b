"""The jobs page's goodput part: each recently reporting job's ETTR, MFU and timeline (server-rendered SVG).

The timeline draws the job's reported intervals (``POST /v1/jobs/{id}/goodput``) on one time axis, from
its first interval's start to its last one's end. Each interval is split into its productive seconds and
its badput categories, drawn side by side in a fixed order: an interval says how much of each, not in
which order they happened. Gaps between intervals (nothing reported yet) stay empty.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.controller.service import Controller
from gpufleet.controller.store.goodput import GoodputStore
from gpufleet.goodput.rollup import CATEGORIES, Goodput, JobInterval, rollup

MAX_JOBS = 20  # the jobs that reported most recently
MAX_INTERVALS = 500  # per timeline: the most recent ones
WIDTH = 600.0  # the SVG's user units


@dataclass(frozen=True, slots=True)
class Segment:
    x: float
    w: float
    category: str  # productive or a badput category (the CSS class)
    title: str  # the tooltip


@dataclass(frozen=True, slots=True)
class GoodputView:
    job: str
    total: Goodput
    segments: tuple[Segment, ...]
    intervals: int
    span_s: float


def segments(intervals: list[JobInterval]) -> tuple[Segment, ...]:
    """The timeline's rectangles for ``intervals`` (one job, oldest first), scaled to :data:`WIDTH`."""
    if not intervals:
        return ()
    t0, t1 = intervals[0].start, max(i.end for i in intervals)
    span = (t1 - t0).total_seconds()
    if span <= 0:
        return ()
    out = []
    for i in intervals:
        x = (i.start - t0).total_seconds() / span * WIDTH
        length = i.seconds
        parts = [("productive", i.productive)] + [(k, i.badput.as_dict()[k]) for k in CATEGORIES]
        for category, seconds in parts:
            if seconds <= 0 or length <= 0:
                continue
            w = seconds / span * WIDTH
            out.append(Segment(round(x, 3), round(max(w, 0.2), 3), category,
                               f"{category} {seconds:.1f} s ({i.start:%H:%M:%S} to {i.end:%H:%M:%S} UTC)"))
            x += w
    return tuple(out)


def goodput_views(c: Controller) -> list[GoodputView]:
    store = GoodputStore(c.store)
    out = []
    for job, _last in store.recent_jobs(MAX_JOBS):
        span = store.span(job)
        if span is None:
            continue
        total = rollup(store.in_range(*span, jobs=[job])[0], *span).jobs.get(job)
        shown = store.latest_of_job(job, MAX_INTERVALS)
        if total is not None:
            out.append(GoodputView(job, total, segments(shown), len(shown), (span[1] - span[0]).total_seconds()))
    return out
