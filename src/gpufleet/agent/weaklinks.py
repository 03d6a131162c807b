"""Weak link reports: error-counter increases too small for a threshold rule, sent so the controller's
correlator can see *coherent* weak patterns (issue #14; docs/correlate.md §Evidence from coherence).

A threshold rule (``nvlink_errors``: 100 NVLink errors in one interval; ``ib_symbol_error``: 10 symbol
errors a minute) says that one link is bad. A failing NVSwitch chip, leaf ASIC, compute tray or marginal
cable often shows first as one or two corrected errors on each of many links, on many nodes, within
minutes: no single link crosses a threshold, and only the set of them, seen by the controller, points at
the shared part. So the agent also reports every increase of a link's error counters below the
threshold, as an *informational* ``link_error`` (rules ``nvlink_error_seen``, ``ib_symbol_error_seen``,
``ib_port_rcv_error_seen``; the catalog judges them info / no action, so no per-node policy acts on one).

At most one such report per link per ``interval_s`` (default 60 s: the correlator counts a witness's
errors by the minute, so more would say nothing new); errors within the interval are carried into the
next report's count. A link whose counter keeps growing therefore sends one event a minute while it
does. ``weak_link_events = false`` in the agent's ``[thresholds]`` turns them off (docs/agent.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class WeakLinks:
    """When each link last sent a weak report, and the errors seen since (kept per agent process)."""

    interval_s: float = 60.0
    _last: dict[str, float] = field(default_factory=dict)  # link key -> time of its last weak report
    _unsent: dict[str, int] = field(default_factory=dict)  # link key -> errors since that report

    def seen(self, key: str, errors: int, t: float) -> int | None:
        """``errors`` new errors on link ``key`` at ``t`` (seconds, the agent's wall clock): the number
        to report now (every error since the link's last weak report), or None (nothing new, or within
        ``interval_s`` of the last report: the errors are carried into the next one)."""
        if errors <= 0:
            return None
        total = self._unsent.get(key, 0) + errors
        last = self._last.get(key)
        if last is not None and 0.0 <= t - last < self.interval_s:
            self._unsent[key] = total
            return None
        self._last[key] = t
        self._unsent.pop(key, None)
        return total

    def carried(self, key: str) -> int:
        """Errors seen on link ``key`` since its last weak report, not reported yet."""
        return self._unsent.get(key, 0)
