"""Weak-signal scenarios, written from the physics of each fault and not from the engine's rules.

The strong scenarios (:mod:`gpufleet.correlate.scenarios`) give every fault enough events to cross a
per-(reporter, link) count. Real failing parts often do not: a degrading NVSwitch chip makes a few GPUs
in *different* trays log one or two corrected link errors each within minutes, and the chip itself a
non-fatal SXID or two; a marginal IB cable logs symbol errors at both ends now and then. Each reporter
alone looks like background; only the *set* of reporters sharing one component is unusual.

Every scenario here: 30 minutes, background noise of the fleet for the whole span (``realistic`` or
``heavy``), partial reporting (each would-be reporter speaks with probability < 1), and at most one
fault. ``noise_only`` has no fault: any actionable verdict on it is a false alarm. ``degrading`` ends
in a hard failure (``failure``): the lead time is how long before it the engine named the part.

Seeds come in two splits: ``tune`` (used while developing the engine) and ``heldout`` (a different
random stream, used only to report). Ground truth is ``truth``; ``accept`` lists other ids a correct
answer may name (a cable's fault may be named by its slot).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import TypeVar

from gpufleet.correlate.scenarios import SPAN, T0, Noise, Scenario, TopologyKind, _Stream
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind as E
from gpufleet.domain.fleet import ComponentKind as K
from gpufleet.domain.topology import Topology

_T = TypeVar("_T")
NONFATAL_SXID = (11012, 20001, 20009, 22013)  # corrected/replayed: catalog severity info
APP_XID = (13, 31, 43)


class WeakFault(StrEnum):
    NOISE_ONLY = "noise_only"
    NVSWITCH = "nvswitch"  # one chip: GPUs on many of its ports see one or two link errors
    SWITCH_TRAY = "switch_tray"  # nvl72: both chips of a switch tray
    COMPUTE_TRAY = "compute_tray"  # nvl72: the GPUs of one tray, on links to many chips
    NODE = "node"  # hgx: the GPUs of one baseboard
    GPU_PORT = "gpu_port"  # one GPU's NVLink port: errors on several of its links (frames no chip)
    IB_CABLE = "ib_cable"  # symbol errors now and then at both ends
    LEAF = "leaf"  # a leaf ASIC: many hosts' ports see a link error or two
    TRAY_FOLLOWS = "tray_follows"  # nvl72: weak tray pattern, swapped, seen again at the new slot
    NIC_FOLLOWS = "nic_follows"  # hgx: weak NIC pattern, NIC swapped, seen again at the new slot
    CABLE_STAYS = "cable_stays"  # weak pattern, unit swapped, pattern again at the old slot
    DEGRADING = "degrading"  # rising weak errors, then the part fails hard


WEAK_FAULTS: dict[TopologyKind, tuple[WeakFault, ...]] = {
    TopologyKind.HGX: (
        WeakFault.NOISE_ONLY, WeakFault.NVSWITCH, WeakFault.NODE, WeakFault.GPU_PORT, WeakFault.IB_CABLE,
        WeakFault.LEAF, WeakFault.NIC_FOLLOWS, WeakFault.CABLE_STAYS, WeakFault.DEGRADING,
    ),
    TopologyKind.NVL72: (
        WeakFault.NOISE_ONLY, WeakFault.NVSWITCH, WeakFault.SWITCH_TRAY, WeakFault.COMPUTE_TRAY,
        WeakFault.GPU_PORT, WeakFault.IB_CABLE, WeakFault.LEAF, WeakFault.TRAY_FOLLOWS,
        WeakFault.CABLE_STAYS, WeakFault.DEGRADING,
    ),
}


class Split(StrEnum):
    TUNE = "tune"
    HELDOUT = "heldout"


def generate_weak(
    topology: Topology, kind: TopologyKind, fault: WeakFault, noise: Noise, seed: int, split: Split = Split.TUNE,
    warmup: timedelta = timedelta(0),
) -> Scenario:
    """One weak-signal scenario; ``split`` picks the random stream (tune vs held-out). ``warmup``: that
    much background (the same noise level, its own random stream) before the scenario starts, as a
    controller that has been running sees it; the scenario's own events are the same either way."""
    if fault not in WEAK_FAULTS[kind]:
        raise InvalidInput("fault", fault.value, f"one of {[f.value for f in WEAK_FAULTS[kind]]} for {kind}")
    if noise is Noise.NONE and fault is WeakFault.NOISE_ONLY:
        raise InvalidInput("noise", noise.value, "realistic or heavy for noise_only")
    if not timedelta(0) <= warmup <= 4 * SPAN:
        raise InvalidInput("warmup", str(warmup), f"from 0 to {4 * SPAN}")
    rng = random.Random(f"weak/{split}/{kind}/{fault}/{noise}/{seed}")
    st = _Stream(rng)
    _background(topology, st, noise)
    onset = rng.uniform(60, 480)
    truth, accept, failure = _WEAK[fault](topology, st, onset)
    before = warmup.total_seconds()
    for k in range(math.ceil(before / SPAN.total_seconds())):  # one background span at a time, back from T0
        warm = _Stream(random.Random(f"weak/{split}/{kind}/{fault}/{noise}/{seed}/warmup/{k}"))
        _background(topology, warm, noise)
        shift = (k + 1) * SPAN.total_seconds()
        for at, _, d in warm.items:
            if -before <= at - shift < 0:  # a burst running past its span stays before T0
                st.items.append((at - shift, len(st.items), d))
    return Scenario(
        kind, fault, noise, seed, st.events(), truth, T0 + timedelta(seconds=onset), frozenset(accept),
        None if failure is None else T0 + timedelta(seconds=failure), split.value,
    )


# -- background ------------------------------------------------------------------------------------------

# Per 30 minutes, fraction of components with background events (our assumption; the public record has
# no per-code fleet rates: see docs/correlate.md §Evaluation). ``heavy`` multiplies every fraction by 4,
# makes bursts longer (geometric, mean 3) and adds a job crash seen on 64 GPUs within seconds.
_SCALE = {Noise.NONE: 0.0, Noise.REALISTIC: 1.0, Noise.HEAVY: 4.0}


def _background(topo: Topology, st: _Stream, level: Noise) -> None:
    scale = _SCALE[level]
    if not scale:
        return
    rng = st.rng
    span = SPAN.total_seconds()
    gpus, nics, chips = topo.of_kind(K.GPU), topo.of_kind(K.NIC), topo.of_kind(K.NVSWITCH)
    host = [ln for ln in topo.links.values() if ln.kind == "ib" and topo.components[ln.a].kind is K.NIC]

    def pick(pool: Sequence[_T], frac: float) -> list[_T]:
        return rng.sample(list(pool), min(len(pool), round(frac * scale * len(pool))))

    def burst() -> list[float]:
        n = rng.randint(1, 3) if level is Noise.REALISTIC else 1 + _geometric(rng, 2 / 3)
        start = rng.uniform(0, span)
        return [min(span, start + rng.expovariate(1 / 120)) for _ in range(n)]

    for g in pick(gpus, 0.03):  # jobs crashing: application XIDs, often with XID 45
        at = rng.uniform(0, span)
        st.add(at, E.XID, g, code=rng.choice(APP_XID))
        if rng.random() < 0.5:
            st.add(at + 0.3, E.XID, g, code=45)
    for g in pick(gpus, 0.01):  # an NVLink CRC error corrected by replay, GPU side
        links = [lid for lid in topo.links_of(g) if topo.links[lid].kind == "nvlink"]
        for at in burst():
            st.add(at, E.LINK_ERROR, g, link=rng.choice(links))
    for c in pick(chips, 0.03):  # non-fatal SXIDs on a random port
        ports = topo.links_of(c)
        for at in burst():
            st.add(at, E.SXID, c, code=rng.choice(NONFATAL_SXID), link=rng.choice(ports))
    for ln in pick(host, 0.02):  # IB symbol errors at one end
        end = ln.a if rng.random() < 0.7 else ln.b
        for at in burst():
            st.add(at, E.LINK_ERROR, end, link=ln.id)
    for g in pick(gpus, 0.01):
        for at in burst():
            st.add(at, E.ECC_SBE, g)
    for n in pick(nics, 0.01):
        for at in burst():
            st.add(at, E.AER_CORRECTED, n)
    if level is Noise.HEAVY:
        crash = rng.uniform(0, span)
        for g in rng.sample(gpus, min(len(gpus), 64)):
            st.add(crash + rng.uniform(0, 5), E.XID, g, code=rng.choice(APP_XID))


def _geometric(rng: random.Random, p_continue: float) -> int:
    n = 0
    while rng.random() < p_continue:
        n += 1
    return n


# -- faults ----------------------------------------------------------------------------------------------

Outcome3 = tuple[str, tuple[str, ...], float | None]  # truth, other accepted ids, failure time


def _gpu_end(topo: Topology, lid: str) -> tuple[str, str]:
    ln = topo.links[lid]
    return (ln.a, ln.b) if topo.components[ln.a].kind is K.GPU else (ln.b, ln.a)


def _port_errors(topo: Topology, st: _Stream, ports: list[str], at: float, spread: float, p_sxid: float) -> None:
    """Each affected NVLink port: the GPU logs one or two corrected link errors (reports w.p. 0.75);
    the chip logs a non-fatal SXID on the port now and then."""
    rng = st.rng
    for lid in ports:
        gpu, chip = _gpu_end(topo, lid)
        t = at + rng.uniform(0, spread)
        if rng.random() < 0.75:
            for _ in range(rng.randint(1, 2)):
                st.add(t, E.LINK_ERROR, gpu, link=lid)
                t += rng.uniform(5, 90)
        if rng.random() < p_sxid:
            st.add(t + rng.uniform(0, 30), E.SXID, chip, code=rng.choice(NONFATAL_SXID), link=lid)


def _chip_ports(topo: Topology, chip: str, rng: random.Random) -> list[str]:
    ports = list(topo.links_of(chip))
    share = rng.uniform(0.25, 0.5) if len(ports) > 16 else rng.uniform(0.5, 0.8)
    return rng.sample(ports, max(3, round(share * len(ports))))


def _nvswitch(topo: Topology, st: _Stream, at: float) -> Outcome3:
    chip = st.rng.choice(topo.of_kind(K.NVSWITCH))
    _port_errors(topo, st, _chip_ports(topo, chip, st.rng), at, 300, 0.3)
    return chip, (), None


def _switch_tray(topo: Topology, st: _Stream, at: float) -> Outcome3:
    tray = st.rng.choice(topo.of_kind(K.SWITCH_TRAY))
    for chip in topo.children(tray):
        _port_errors(topo, st, _chip_ports(topo, chip, st.rng), at, 300, 0.3)
    return tray, (), None


def _unit_gpus(topo: Topology, st: _Stream, unit: str, at: float, least: int) -> None:
    """A tray/baseboard problem (power, connector, retimer): several of its GPUs see errors on links
    to different chips; a NIC of the unit may log a corrected AER."""
    rng = st.rng
    gpus = [c for c in topo.children(unit) if topo.components[c].kind is K.GPU]
    for g in rng.sample(gpus, rng.randint(least, len(gpus))):
        links = [lid for lid in topo.links_of(g) if topo.links[lid].kind == "nvlink"]
        _port_errors(topo, st, rng.sample(links, rng.randint(1, 2)), at, 300, 0.1)
    nics = [c for c in topo.children(unit) if topo.components[c].kind is K.NIC]
    if nics and rng.random() < 0.5:
        st.add(at + rng.uniform(0, 300), E.AER_CORRECTED, rng.choice(nics))


def _compute_tray(topo: Topology, st: _Stream, at: float) -> Outcome3:
    tray = st.rng.choice(topo.of_kind(K.COMPUTE_TRAY))
    _unit_gpus(topo, st, tray, at, 3)
    return tray, (), None


def _node(topo: Topology, st: _Stream, at: float) -> Outcome3:
    node = st.rng.choice(topo.of_kind(K.NODE))
    _unit_gpus(topo, st, node, at, 4)
    return node, (), None


def _gpu_port(topo: Topology, st: _Stream, at: float) -> Outcome3:
    rng = st.rng
    g = rng.choice(topo.of_kind(K.GPU))
    links = [lid for lid in topo.links_of(g) if topo.links[lid].kind == "nvlink"]
    for lid in rng.sample(links, rng.randint(min(3, len(links)), min(6, len(links)))):
        t = at + rng.uniform(0, 300)
        for _ in range(rng.randint(1, 3)):
            st.add(t, E.LINK_ERROR, g, link=lid)
            t += rng.uniform(10, 120)
    return g, (), None


def _host_link(topo: Topology, rng: random.Random) -> str:
    return rng.choice([ln.id for ln in topo.links.values() if ln.kind == "ib" and topo.components[ln.a].kind is K.NIC])


def _cable_errors(topo: Topology, st: _Stream, lid: str, start: float, minutes: int, p: float) -> None:
    """A marginal cable or transceiver: in each minute, each end logs a symbol error w.p. ``p``."""
    ln = topo.links[lid]
    for m in range(minutes):
        for end in (ln.a, ln.b):
            if st.rng.random() < p:
                st.add(start + 60 * m + st.rng.uniform(0, 60), E.LINK_ERROR, end, link=lid)


def _ib_cable(topo: Topology, st: _Stream, at: float) -> Outcome3:
    lid = _host_link(topo, st.rng)
    _cable_errors(topo, st, lid, at, st.rng.randint(8, 15), st.rng.uniform(0.35, 0.6))
    return lid, (), None


def _leaf(topo: Topology, st: _Stream, at: float) -> Outcome3:
    rng = st.rng
    leaf = rng.choice(topo.of_kind(K.LEAF_SWITCH))
    ports = list(topo.links_of(leaf))
    for lid in rng.sample(ports, round(rng.uniform(0.2, 0.4) * len(ports))):
        far = topo.links[lid].other(leaf)
        if rng.random() < 0.75:
            t = at + rng.uniform(0, 300)
            for _ in range(rng.randint(1, 2)):
                st.add(t, E.LINK_ERROR, far, link=lid)
                t += rng.uniform(5, 120)
    return leaf, (), None


def _swap(topo: Topology, st: _Stream, a: str, b: str, at: float) -> None:
    st.add(at, E.MOVED, serial=topo.components[a].serial, from_slot=a, to_slot=b)
    st.add(at + 30, E.MOVED, serial=topo.components[b].serial, from_slot=b, to_slot=a)


def _tray_follows(topo: Topology, st: _Stream, at: float) -> Outcome3:
    a, b = st.rng.sample(topo.of_kind(K.COMPUTE_TRAY), 2)
    _unit_gpus(topo, st, a, at, 2)
    swap = at + 420
    _swap(topo, st, a, b, swap)
    _unit_gpus(topo, st, b, swap + 120, 2)
    return b, (), None


def _nic_pattern(topo: Topology, st: _Stream, nic: str, at: float) -> None:
    """A failing NIC (SerDes/transceiver): a few symbol errors on its port and corrected AERs."""
    rng = st.rng
    lid = topo.links_of(nic)[0]
    for _ in range(rng.randint(2, 4)):
        st.add(at + rng.uniform(0, 360), E.LINK_ERROR, nic, link=lid)
    for _ in range(rng.randint(1, 2)):
        st.add(at + rng.uniform(0, 360), E.AER_CORRECTED, nic)


def _nic_follows(topo: Topology, st: _Stream, at: float) -> Outcome3:
    a, b = st.rng.sample(topo.of_kind(K.NIC), 2)
    _nic_pattern(topo, st, a, at)
    swap = at + 420
    _swap(topo, st, a, b, swap)
    _nic_pattern(topo, st, b, swap + 120)
    return b, (), None


def _cable_stays(topo: Topology, st: _Stream, at: float) -> Outcome3:
    rng = st.rng
    if topo.of_kind(K.COMPUTE_TRAY):  # nvl72: the tray's cable cartridge / connector at the slot
        a, b = rng.sample(topo.of_kind(K.COMPUTE_TRAY), 2)
        _unit_gpus(topo, st, a, at, 2)
        swap = at + 420
        _swap(topo, st, a, b, swap)
        _unit_gpus(topo, st, a, swap + 120, 2)
        return a, (), None
    lid = _host_link(topo, rng)  # hgx: the host cable; its NIC is swapped with another node's
    nic = topo.links[lid].a
    other = rng.choice([n for n in topo.of_kind(K.NIC) if n != nic])
    _cable_errors(topo, st, lid, at, 6, 0.35)
    swap = at + 420
    _swap(topo, st, nic, other, swap)
    _cable_errors(topo, st, lid, swap + 120, 6, 0.35)
    return lid, (nic,), None


def _degrading(topo: Topology, st: _Stream, at: float) -> Outcome3:
    """A chip whose error rate rises for 10-20 minutes, then fails (fatal SXID, GPUs lose NVLink)."""
    rng = st.rng
    chip = rng.choice(topo.of_kind(K.NVSWITCH))
    ports = list(topo.links_of(chip))
    fail = at + rng.uniform(600, 1200)
    t = at
    while t < fail:  # errors arrive faster as the part degrades: one every 200 s at first, every 20 s near the end
        frac = (t - at) / (fail - at)
        lid = rng.choice(ports)
        gpu, _ = _gpu_end(topo, lid)
        if rng.random() < 0.75:
            kind_is_sxid = rng.random() < 0.25
            if kind_is_sxid:
                st.add(t, E.SXID, chip, code=rng.choice(NONFATAL_SXID), link=lid)
            else:
                st.add(t, E.LINK_ERROR, gpu, link=lid)
        t += rng.expovariate(1 / (200 - 180 * frac))
    st.add(fail, E.SXID, chip, code=20034, link=rng.choice(ports))
    for lid in rng.sample(ports, min(len(ports), 4)):
        gpu, _ = _gpu_end(topo, lid)
        st.add(fail + rng.uniform(0.5, 3), E.XID, gpu, code=74, link=lid)
    return chip, (), fail


def _noise_only(topo: Topology, st: _Stream, at: float) -> Outcome3:
    return "", (), None


_WEAK: dict[WeakFault, Callable[[Topology, _Stream, float], Outcome3]] = {
    WeakFault.NOISE_ONLY: _noise_only,
    WeakFault.NVSWITCH: _nvswitch,
    WeakFault.SWITCH_TRAY: _switch_tray,
    WeakFault.COMPUTE_TRAY: _compute_tray,
    WeakFault.NODE: _node,
    WeakFault.GPU_PORT: _gpu_port,
    WeakFault.IB_CABLE: _ib_cable,
    WeakFault.LEAF: _leaf,
    WeakFault.TRAY_FOLLOWS: _tray_follows,
    WeakFault.NIC_FOLLOWS: _nic_follows,
    WeakFault.CABLE_STAYS: _cable_stays,
    WeakFault.DEGRADING: _degrading,
}


def weak_topology(kind: TopologyKind) -> Topology:
    """The fabric the weak suite runs on: 64 HGX nodes (512 GPUs), or 4 NVL72 racks (288 GPUs)."""
    from gpufleet.domain.topology_gen import generate_hgx, generate_nvl72

    return generate_hgx(64) if kind is TopologyKind.HGX else generate_nvl72(4)
