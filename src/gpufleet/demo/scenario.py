"""The demo's fault schedule: a realistic mix, placed reproducibly by a seed.

Offsets are fractions of the run so any ``--duration`` shows every fault. Nodes are drawn from the
fleet with the seed; the failing switch takes a whole rack's rail leaf; the bad health check flags
most of the fleet at once (so the blast-radius breaker has something to stop).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from gpufleet.domain.fleet import Fleet


class FaultKind(StrEnum):
    XID79 = "xid79_fell_off_bus"
    XID48 = "xid48_dbe_row_remap"
    XID94 = "xid94_contained_ecc"
    XID95 = "xid95_uncontained_ecc"
    NVLINK = "nvlink_errors"
    LINK_FLAP = "ib_link_flaps"
    SWITCH = "rack_switch_failure"
    BAD_CHECK = "bad_health_check"
    NOISE = "app_xid_noise"


@dataclass(frozen=True, slots=True)
class Injection:
    at: timedelta  # offset from the start of the run
    kind: FaultKind
    nodes: tuple[str, ...]
    crashes_job: bool  # the fault kills the training processes on the spot
    note: str


# (fraction of the run, kind, crashes the job?, how many nodes)
_PLAN: tuple[tuple[float, FaultKind, bool, int], ...] = (
    (0.07, FaultKind.XID79, True, 1),
    (0.16, FaultKind.XID48, True, 1),
    (0.24, FaultKind.XID94, False, 1),
    (0.33, FaultKind.NVLINK, False, 1),
    (0.42, FaultKind.XID95, True, 1),
    (0.50, FaultKind.LINK_FLAP, True, 1),
    (0.58, FaultKind.SWITCH, True, 0),
    (0.74, FaultKind.BAD_CHECK, False, 0),
)


def schedule(fleet: Fleet, duration: timedelta, seed: int) -> list[Injection]:
    rng = random.Random(seed)
    nodes = [n.id for n in fleet]
    racks = fleet.racks()
    out: list[Injection] = []
    used: set[str] = set()

    def pick() -> str:
        free = [n for n in nodes if n not in used] or nodes
        choice = rng.choice(free)
        used.add(choice)
        return choice

    for frac, kind, crashes, count in _PLAN:
        at = duration * frac + timedelta(seconds=rng.randint(0, 600))
        if kind == FaultKind.SWITCH:
            rack = rng.choice(sorted(racks))
            members = tuple(sorted(racks[rack]))
            out.append(Injection(at, kind, members, crashes, f"leaf switch of rack {rack} fails (all its links down)"))
        elif kind == FaultKind.BAD_CHECK:
            flagged = tuple(sorted(rng.sample(nodes, k=max(1, int(len(nodes) * 0.6)))))
            out.append(Injection(at, kind, flagged, crashes,
                                 f"a buggy health-check rollout flags {len(flagged)} of {len(nodes)} nodes"))
        else:
            picked = tuple(pick() for _ in range(count))
            out.append(Injection(at, kind, picked, crashes, kind.value.replace("_", " ")))
    # Background noise: application XIDs and corrected errors that must not drain anything.
    for _ in range(max(4, len(nodes) // 2)):
        at = timedelta(seconds=rng.uniform(0, duration.total_seconds()))
        out.append(Injection(at, FaultKind.NOISE, (rng.choice(nodes),), False, "application XID / corrected error"))
    return sorted(out, key=lambda i: i.at)


def fault_nodes(injections: Sequence[Injection]) -> set[str]:
    return {n for i in injections if i.kind not in (FaultKind.NOISE, FaultKind.BAD_CHECK) for n in i.nodes}
