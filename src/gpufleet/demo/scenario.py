"""The demo's fault schedule: a realistic mix, placed reproducibly by a seed, named in topology ids.

Offsets are fractions of the run so any ``--duration`` shows every fault. Every target is taken from
the fleet's topology (``gpufleet.topology/v1``), as an agent that knows its place would report it: a
GPU fault names the GPU, an InfiniBand fault the NIC *and* the cable from it to its leaf, an NVLink
burst the GPU and the NVLink link it lost lanes on.

The failing switch is a rail leaf. On a rail-optimised fabric a leaf serves one rail of every node of
its scalable unit (32 nodes), so when it dies each of those nodes loses its NIC on that rail and no
multi-node job can run there: one shared component, every node of the unit behind it. The bad health
check flags most of the fleet at once (so the blast-radius breaker has something to stop).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from gpufleet.domain.fleet import ComponentKind
from gpufleet.domain.topology import Topology


class FaultKind(StrEnum):
    XID79 = "xid79_fell_off_bus"
    XID48 = "xid48_dbe_row_remap"
    XID94 = "xid94_contained_ecc"
    XID95 = "xid95_uncontained_ecc"
    NVLINK = "nvlink_errors"
    LINK_FLAP = "ib_link_flaps"
    SWITCH = "leaf_switch_failure"
    BAD_CHECK = "bad_health_check"
    NOISE = "app_xid_noise"


@dataclass(frozen=True, slots=True)
class Target:
    """Where one node sees the fault: a topology component and, for a link-level fault, the link."""

    node: str
    component: str
    link: str | None = None


@dataclass(frozen=True, slots=True)
class Injection:
    at: timedelta  # offset from the start of the run
    kind: FaultKind
    targets: tuple[Target, ...]
    crashes_job: bool  # the fault kills the training processes on the spot
    note: str
    culprit: str | None = None  # the shared component that failed (world truth), for a switch failure

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.node for t in self.targets))


# (fraction of the run, kind, crashes the job?)
_PLAN: tuple[tuple[float, FaultKind, bool], ...] = (
    (0.07, FaultKind.XID79, True),
    (0.16, FaultKind.XID48, True),
    (0.24, FaultKind.XID94, False),
    (0.33, FaultKind.NVLINK, False),
    (0.42, FaultKind.XID95, True),
    (0.50, FaultKind.LINK_FLAP, True),
    (0.58, FaultKind.SWITCH, True),
    (0.74, FaultKind.BAD_CHECK, False),
)


def schedule(topo: Topology, duration: timedelta, seed: int) -> list[Injection]:
    rng = random.Random(seed)
    nodes = sorted(topo.of_kind(ComponentKind.NODE))
    out: list[Injection] = []
    used: set[str] = set()

    def pick() -> str:
        free = [n for n in nodes if n not in used] or nodes
        choice = rng.choice(free)
        used.add(choice)
        return choice

    for frac, kind, crashes in _PLAN:
        at = duration * frac + timedelta(seconds=rng.randint(0, 600))
        if kind == FaultKind.SWITCH:
            leaf = rng.choice(sorted(topo.of_kind(ComponentKind.LEAF_SWITCH)))
            targets = cabled_to(topo, leaf)
            out.append(Injection(at, kind, targets, crashes, f"leaf switch {leaf} fails: the {len(targets)} nodes "
                                 "cabled to it each lose their NIC on its rail", culprit=leaf))
        elif kind == FaultKind.BAD_CHECK:
            flagged = sorted(rng.sample(nodes, k=max(1, int(len(nodes) * 0.6))))
            out.append(Injection(at, kind, tuple(Target(n, n) for n in flagged), crashes,
                                 f"a buggy health-check rollout flags {len(flagged)} of {len(nodes)} nodes"))
        else:
            node = pick()
            gpu = rng.choice(_children(topo, node, ComponentKind.GPU))
            if kind == FaultKind.NVLINK:
                target = Target(node, gpu, rng.choice(_links(topo, gpu, "nvlink")))
            elif kind == FaultKind.LINK_FLAP:
                nic = rng.choice(_children(topo, node, ComponentKind.NIC))
                target = Target(node, nic, _links(topo, nic, "ib")[0])
            else:
                target = Target(node, gpu)
            out.append(Injection(at, kind, (target,), crashes, kind.value.replace("_", " ")))
    # Background noise: application XIDs that must not drain anything.
    for _ in range(max(4, len(nodes) // 2)):
        at = timedelta(seconds=rng.uniform(0, duration.total_seconds()))
        node = rng.choice(nodes)
        out.append(Injection(at, FaultKind.NOISE, (Target(node, rng.choice(_children(topo, node, ComponentKind.GPU))),),
                             False, "application XID"))
    return sorted(out, key=lambda i: i.at)


def cabled_to(topo: Topology, switch: str) -> tuple[Target, ...]:
    """Each host with a NIC cabled to ``switch``: (host, that NIC, the cable)."""
    out = []
    for lid in topo.links_of(switch):
        nic = topo.links[lid].other(switch)
        host = topo.node_of(nic)
        if host is not None and topo.components[nic].kind == ComponentKind.NIC:
            out.append(Target(host, nic, lid))
    return tuple(sorted(out, key=lambda t: t.node))


def _children(topo: Topology, node: str, kind: ComponentKind) -> list[str]:
    return sorted(c for c in topo.children(node) if topo.components[c].kind == kind)


def _links(topo: Topology, comp: str, kind: str) -> list[str]:
    return sorted(lid for lid in topo.links_of(comp) if topo.links[lid].kind == kind)
