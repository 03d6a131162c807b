"""Synthetic fault scenarios with ground truth: fault type x topology x noise level x seed.

Each scenario is a 30-minute ``gpufleet.event/v1`` stream over a generated topology: background noise
for the whole span and one injected fault whose symptoms follow the catalog's local/remote semantics
(docs/correlate.md §Evaluation). Reporting is partial and random (a reporter may stay silent), codes are
drawn from the fault's plausible set, and affected GPUs add collateral XIDs (45, 43, 13).

The ground truth is the component (or link) id a perfect engine names first. For the two move
scenarios it is the slot where the faulty unit sits at the end (``moved_follows``) or the slot whose
cabling is bad (``moved_stays``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.eventio import FileEvent
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology import Topology

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SPAN = timedelta(minutes=30)


class TopologyKind(StrEnum):
    HGX = "hgx"
    NVL72 = "nvl72"


class FaultType(StrEnum):
    GPU = "gpu"
    GPU_NVLINK = "gpu_nvlink"  # one GPU's NVLink port: errors on several of its links
    NVSWITCH = "nvswitch"
    SWITCH_TRAY = "switch_tray"  # nvl72
    COMPUTE_TRAY = "compute_tray"  # nvl72
    NODE = "node"  # hgx
    NVLINK = "nvlink"  # nvl72: one GPU<->NVSwitch cable-cartridge link
    IB_CABLE = "ib_cable"
    FLAPPING_CABLE = "flapping_cable"
    LEAF = "leaf"
    LEAF_PARTIAL = "leaf_partial"  # a port group of a leaf: only 3-6 hosts see it
    SPINE = "spine"
    MOVED_FOLLOWS = "moved_follows"  # nvl72: faulty tray swapped; the pattern follows it
    MOVED_STAYS = "moved_stays"  # nvl72: tray swapped; the pattern stays at the slot


class Noise(StrEnum):
    NONE = "none"
    REALISTIC = "realistic"
    HEAVY = "heavy"


FAULTS: dict[TopologyKind, tuple[FaultType, ...]] = {
    TopologyKind.HGX: (
        FaultType.GPU,
        FaultType.GPU_NVLINK,
        FaultType.LEAF_PARTIAL,
        FaultType.NVSWITCH,
        FaultType.NODE,
        FaultType.IB_CABLE,
        FaultType.FLAPPING_CABLE,
        FaultType.LEAF,
        FaultType.SPINE,
    ),
    TopologyKind.NVL72: (
        FaultType.GPU,
        FaultType.GPU_NVLINK,
        FaultType.LEAF_PARTIAL,
        FaultType.NVSWITCH,
        FaultType.SWITCH_TRAY,
        FaultType.COMPUTE_TRAY,
        FaultType.NVLINK,
        FaultType.IB_CABLE,
        FaultType.FLAPPING_CABLE,
        FaultType.LEAF,
        FaultType.SPINE,
        FaultType.MOVED_FOLLOWS,
        FaultType.MOVED_STAYS,
    ),
}
SWITCH_KINDS = frozenset({"nvswitch", "switch_tray", "leaf_switch", "spine_switch", "core_switch"})


@dataclass(frozen=True, slots=True)
class Scenario:
    topology_kind: TopologyKind
    fault: StrEnum  # FaultType here, WeakFault in :mod:`gpufleet.correlate.weak`
    noise: Noise
    seed: int
    events: tuple[FileEvent, ...]
    truth: str  # "" when the scenario has no fault (noise only)
    onset: datetime
    accept: frozenset[str] = frozenset()  # other ids a correct answer may name
    failure: datetime | None = None  # when a degrading part fails hard (lead time is measured to it)
    split: str = "tune"

    @property
    def name(self) -> str:
        return f"{self.topology_kind}/{self.fault}/{self.noise}/{self.seed}"


class _Stream:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.items: list[tuple[float, int, dict[str, object]]] = []

    def add(self, at: float, kind: E, component: str = "", **kw: object) -> None:
        self.items.append((at, len(self.items), {"kind": kind, "component": component, **kw}))

    def events(self) -> tuple[FileEvent, ...]:
        out: list[FileEvent] = []
        for n, (at, _, d) in enumerate(sorted(self.items, key=lambda x: (x[0], x[1])), start=1):
            kind = d["kind"]
            assert isinstance(kind, E)
            out.append(
                FileEvent(
                    line=n,
                    time=T0 + timedelta(seconds=at),
                    kind=kind,
                    component=str(d.get("component", "")),
                    code=_int(d.get("code")),
                    link=_str(d.get("link")),
                    serial=_str(d.get("serial")),
                    from_slot=_str(d.get("from_slot")),
                    to_slot=_str(d.get("to_slot")),
                )
            )
        return tuple(out)


def _int(v: object) -> int | None:
    return v if isinstance(v, int) else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def generate(topology: Topology, kind: TopologyKind, fault: FaultType, noise: Noise, seed: int) -> Scenario:
    """One scenario on ``topology`` (as made by ``generate_hgx`` / ``generate_nvl72``)."""
    if fault not in FAULTS[kind]:
        raise InvalidInput("fault", fault.value, f"one of {[f.value for f in FAULTS[kind]]} for {kind}")
    rng = random.Random(f"{kind}/{fault}/{noise}/{seed}")
    st = _Stream(rng)
    _noise(topology, st, noise)
    onset = rng.uniform(120, 600)
    truth = _INJECT[fault](topology, kind, st, onset)
    return Scenario(kind, fault, noise, seed, st.events(), truth, T0 + timedelta(seconds=onset))


# -- background noise ----------------------------------------------------------------------------------

# Fractions of components with a background event in a 30-minute window (our assumption, docs/correlate.md):
# application XIDs on ~2 % of GPUs (jobs crashing), 1-3 corrected events on ~1-2 % of GPUs / NICs / links,
# 1-3 non-fatal SXIDs on ~2 % of NVSwitch chips.
_NOISE_RATE = {Noise.NONE: 0.0, Noise.REALISTIC: 1.0, Noise.HEAVY: 5.0}


def _noise(topo: Topology, st: _Stream, level: Noise) -> None:
    scale = _NOISE_RATE[level]
    if not scale:
        return
    rng = st.rng
    span = SPAN.total_seconds()
    gpus = topo.of_kind(K.GPU)
    nics = topo.of_kind(K.NIC)
    ib = [
        ln
        for ln in topo.links.values()
        if ln.kind == "ib" and ln.a in topo.components and topo.components[ln.a].kind == K.NIC
    ]
    for g in rng.sample(gpus, min(len(gpus), round(0.02 * scale * len(gpus)))):
        at = rng.uniform(0, span)
        st.add(at, E.XID, g, code=rng.choice((13, 31, 43, 43)))
        if rng.random() < 0.5:
            st.add(at + 0.5, E.XID, g, code=45)
    for g in rng.sample(gpus, min(len(gpus), round(0.01 * scale * len(gpus)))):
        for _ in range(_burst(rng, level)):
            st.add(rng.uniform(0, span), E.ECC_SBE, g)
    for n in rng.sample(nics, min(len(nics), round(0.01 * scale * len(nics)))):
        for _ in range(_burst(rng, level)):
            st.add(rng.uniform(0, span), E.AER_CORRECTED, n)
    for ln in rng.sample(ib, min(len(ib), round(0.02 * scale * len(ib)))):
        for _ in range(_burst(rng, level)):
            end = ln.a if rng.random() < 0.7 else ln.b
            st.add(rng.uniform(0, span), E.LINK_ERROR, end, link=ln.id)
    chips = topo.of_kind(K.NVSWITCH)
    for chip in rng.sample(chips, min(len(chips), round(0.02 * scale * len(chips)))):
        lids = topo.links_of(chip)
        for _ in range(_burst(rng, level)):  # non-fatal SXIDs: SBE, replay, short error rate
            st.add(
                rng.uniform(0, span),
                E.SXID,
                chip,
                code=rng.choice((11012, 20001, 20009, 22013)),
                link=rng.choice(lids) if lids else None,
            )
    if level is Noise.HEAVY:  # a few unrelated degraded readings (hot GPUs)
        for g in rng.sample(gpus, min(len(gpus), max(1, round(0.002 * len(gpus))))):
            st.add(rng.uniform(0, span), E.THERMAL, g)


def _burst(rng: random.Random, level: Noise) -> int:
    if level is Noise.REALISTIC:
        return rng.randint(1, 3)
    n = 1
    while rng.random() < 0.55:
        n += 1
    return n


# -- injected faults -----------------------------------------------------------------------------------


def _gpu_links(topo: Topology, gpu: str) -> list[str]:
    return [lid for lid in topo.links_of(gpu) if topo.links[lid].kind == "nvlink"]


def _nvlink_xid(kind: TopologyKind, rng: random.Random) -> int:
    return rng.choice((74, 74, 136)) if kind is TopologyKind.HGX else rng.choice((149, 145, 74))


def _collateral(st: _Stream, gpu: str, at: float) -> None:
    if st.rng.random() < 0.6:
        st.add(at + st.rng.uniform(0.1, 2), E.XID, gpu, code=st.rng.choice((45, 45, 43, 13)))


def _inject_gpu(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    g = rng.choice(topo.of_kind(K.GPU))
    code = rng.choice((79, 48, 95, 119, 64))
    st.add(at, E.XID, g, code=code)
    for i in range(rng.randint(0, 2)):
        st.add(at + 30 * (i + 1) + rng.uniform(0, 20), E.XID, g, code=code)
    if code == 48:
        st.add(at + 1, E.ECC_DBE, g)
    _collateral(st, g, at)
    return g


def _nvlink_storm(
    topo: Topology,
    kind: TopologyKind,
    st: _Stream,
    at: float,
    links: list[str],
    p_gpu: float,
    p_switch: float,
) -> None:
    rng = st.rng
    for lid in links:
        ln = topo.links[lid]
        gpu, chip = (ln.a, ln.b) if topo.components[ln.a].kind == K.GPU else (ln.b, ln.a)
        t = at + rng.uniform(0, 240)
        if rng.random() < p_gpu:
            st.add(t, E.XID, gpu, code=_nvlink_xid(kind, rng), link=lid)
            _collateral(st, gpu, t)
        if rng.random() < p_switch:
            st.add(t + rng.uniform(0, 5), E.SXID, chip, code=rng.choice((20034, 12028, 22012, 19084)), link=lid)


def _inject_nvswitch(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    chip = st.rng.choice(topo.of_kind(K.NVSWITCH))
    _nvlink_storm(topo, kind, st, at, list(topo.links_of(chip)), 0.85, 0.3)
    return chip


def _inject_switch_tray(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    tray = st.rng.choice(topo.of_kind(K.SWITCH_TRAY))
    links = [lid for chip in topo.children(tray) for lid in topo.links_of(chip)]
    _nvlink_storm(topo, kind, st, at, links, 0.6, 0.2)
    return tray


def _tray_storm(topo: Topology, kind: TopologyKind, st: _Stream, at: float, tray: str) -> None:
    rng = st.rng
    for gpu in [c for c in topo.children(tray) if topo.components[c].kind == K.GPU]:
        links = _gpu_links(topo, gpu)
        _nvlink_storm(topo, kind, st, at, rng.sample(links, max(1, len(links) // 3)), 0.9, 0.2)


def _inject_compute_tray(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    tray = st.rng.choice(topo.of_kind(K.COMPUTE_TRAY))
    _tray_storm(topo, kind, st, at, tray)
    return tray


def _inject_node(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    node = rng.choice(topo.of_kind(K.NODE))
    parts = list(topo.children(node))
    gpus = [c for c in parts if topo.components[c].kind == K.GPU]
    nics = [c for c in parts if topo.components[c].kind == K.NIC]
    for g in rng.sample(gpus, rng.randint(3, len(gpus))):
        t = at + rng.uniform(0, 60)
        st.add(t, E.XID, g, code=79)
        _collateral(st, g, t)
    for n in rng.sample(nics, rng.randint(1, 3)):
        st.add(at + rng.uniform(0, 60), E.AER_UNCORRECTED, n)
    return node


def _inject_nvlink(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    lid = rng.choice([ln.id for ln in topo.links.values() if ln.kind == "nvlink"])
    ln = topo.links[lid]
    for i in range(rng.randint(2, 5)):
        t = at + 40 * i + rng.uniform(0, 30)
        st.add(t, E.XID, ln.a, code=_nvlink_xid(kind, rng), link=lid)
        if rng.random() < 0.8:
            st.add(t + rng.uniform(0, 3), E.SXID, ln.b, code=rng.choice((20034, 20012)), link=lid)
    return lid


def _host_links(topo: Topology) -> list[str]:
    return [ln.id for ln in topo.links.values() if ln.kind == "ib" and topo.components[ln.a].kind == K.NIC]


def _inject_ib_cable(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    lid = rng.choice(_host_links(topo))
    ln = topo.links[lid]
    for end in (ln.a, ln.b):
        t = at + rng.uniform(0, 30)
        for _ in range(rng.randint(55, 120)):  # symbol-error storm: a bad transceiver or cable
            st.add(t, E.LINK_ERROR, end, link=lid)
            t += rng.expovariate(1 / 6)
    if rng.random() < 0.5:
        st.add(at + rng.uniform(100, 400), E.LINK_DOWN, ln.a, link=lid)
    return lid


def _inject_flapping(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    lid = rng.choice(_host_links(topo))
    ln = topo.links[lid]
    t = at
    while t < at + 600:
        st.add(t, E.LINK_FLAP, ln.a, link=lid)
        if rng.random() < 0.8:
            st.add(t + rng.uniform(0, 1), E.LINK_FLAP, ln.b, link=lid)
        t += rng.uniform(2, 20)
    return lid


def _inject_leaf(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    leaf = rng.choice(topo.of_kind(K.LEAF_SWITCH))
    for lid in topo.links_of(leaf):
        ln = topo.links[lid]
        far = ln.other(leaf)
        if rng.random() < 0.9:
            st.add(at + rng.uniform(0, 20), E.LINK_DOWN, far, link=lid)
    return leaf


def _inject_gpu_nvlink(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    g = rng.choice(topo.of_kind(K.GPU))
    links = _gpu_links(topo, g)
    _nvlink_storm(topo, kind, st, at, rng.sample(links, rng.randint(min(3, len(links)), len(links))), 0.9, 0.3)
    return g


def _inject_leaf_partial(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    leaf = rng.choice(topo.of_kind(K.LEAF_SWITCH))
    hosts = [lid for lid in topo.links_of(leaf) if topo.components[topo.links[lid].other(leaf)].kind == K.NIC]
    for lid in rng.sample(hosts, min(len(hosts), rng.randint(3, 6))):
        far = topo.links[lid].other(leaf)
        for i in range(rng.randint(1, 3)):
            st.add(at + 60 * i + rng.uniform(0, 20), E.LINK_DOWN, far, link=lid)
    return leaf


def _inject_spine(topo: Topology, kind: TopologyKind, st: _Stream, at: float) -> str:
    rng = st.rng
    spine = rng.choice(topo.of_kind(K.SPINE_SWITCH))
    for lid in topo.links_of(spine):
        if rng.random() < 0.85:
            st.add(at + rng.uniform(0, 20), E.LINK_DOWN, topo.links[lid].other(spine), link=lid)
    return spine


def _swap(topo: Topology, st: _Stream, a: str, b: str, at: float) -> None:
    st.add(at, E.MOVED, serial=topo.components[a].serial, from_slot=a, to_slot=b)
    st.add(at + 1, E.MOVED, serial=topo.components[b].serial, from_slot=b, to_slot=a)


def _inject_moved(topo: Topology, kind: TopologyKind, st: _Stream, at: float, follows: bool) -> str:
    rng = st.rng
    a, b = rng.sample(topo.of_kind(K.COMPUTE_TRAY), 2)
    _tray_storm(topo, kind, st, at, a)
    swap_at = at + 300 + rng.uniform(0, 60)
    _swap(topo, st, a, b, swap_at)
    where = b if follows else a
    _tray_storm(topo, kind, st, swap_at + 120, where)
    return where


_Inject = Callable[[Topology, TopologyKind, _Stream, float], str]
_INJECT: dict[FaultType, _Inject] = {
    FaultType.GPU: _inject_gpu,
    FaultType.GPU_NVLINK: _inject_gpu_nvlink,
    FaultType.LEAF_PARTIAL: _inject_leaf_partial,
    FaultType.NVSWITCH: _inject_nvswitch,
    FaultType.SWITCH_TRAY: _inject_switch_tray,
    FaultType.COMPUTE_TRAY: _inject_compute_tray,
    FaultType.NODE: _inject_node,
    FaultType.NVLINK: _inject_nvlink,
    FaultType.IB_CABLE: _inject_ib_cable,
    FaultType.FLAPPING_CABLE: _inject_flapping,
    FaultType.LEAF: _inject_leaf,
    FaultType.SPINE: _inject_spine,
    FaultType.MOVED_FOLLOWS: lambda t, k, s, a: _inject_moved(t, k, s, a, True),
    FaultType.MOVED_STAYS: lambda t, k, s, a: _inject_moved(t, k, s, a, False),
}
