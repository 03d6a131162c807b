"""Simulated faults for ``gpufleet agent --device sim --inject SPEC`` (repeatable).

Grammar: ``KIND[:ARG]@TARGET[@+SECONDS]``; targets ``gpu<I>``, ``gpu<I>.nvlink<N>``, ``nic<K>`` (the k-th
InfiniBand HCA, as in the agent's ``<node>-nic<K>``), ``pci=dddd:bb:dd.f`` (a device the node may not
know); ``@+SECONDS`` fires that long after the agent's first tick (on the agent's clock).

=================  ========================  ==================================================================
spec               target                    what changes (read by the agent's real collectors and rules)
=================  ========================  ==================================================================
xid:CODE           gpuI                      an NVML XID event; with a simulated kernel log also the driver's line
xid:CODE           pci=dddd:bb:dd.f          only the driver's kernel-log line (needs a simulated kernel log)
ecc_dbe[:COUNT]    gpuI                      uncorrectable ECC counters +COUNT (default 1), row remap pending
ecc_sbe:COUNT      gpuI                      correctable ECC counters +COUNT
gpu_lost           gpuI                      XID 79, then every read says lost (and the driver's lines)
thermal[:CELSIUS]  gpuI                      held at CELSIUS (default 94) with thermal slowdown asserted
nvlink_errors:N    gpuI[.nvlinkL]            CRC flit counter of link L (default 0) +N
nvlink_down        gpuI.nvlinkL              link L down
ib_down            nicK                      port 1 state ``1: DOWN``, phys_state ``3: Disabled``
ib_flap[:COUNT]    nicK                      port 1 ``link_downed`` +COUNT (default 1)
ib_symbol:COUNT    nicK                      port 1 ``symbol_error`` +COUNT
ib_rcv:COUNT       nicK                      port 1 ``port_rcv_errors`` +COUNT
=================  ========================  ==================================================================

Faults fire after a tick's collection, so the readings before them are the baseline the counter rules
compare with; a counter fault shows at the next slow (GPU) or InfiniBand read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.agent.clock import AgentClock
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.agent.devices.simhost import SimKernelLog, SimSysfs
from gpufleet.domain.errors import InvalidInput

log = logging.getLogger(__name__)

GRAMMAR = "KIND[:ARG]@TARGET[@+SECONDS], e.g. xid:94@gpu1, ecc_dbe@gpu0, ib_down@nic5@+30 (docs/agent.md)"
_FIELD = "--inject"


@dataclass(frozen=True, slots=True)
class _Kind:
    arg: str | None  # the ARG's name; None = takes none
    default: int | None  # None with an arg name = the ARG is required
    targets: frozenset[str]  # "gpu", "gpu.nvlink", "nic", "pci"


KINDS: dict[str, _Kind] = {
    "xid": _Kind("CODE", None, frozenset({"gpu", "pci"})),
    "ecc_dbe": _Kind("COUNT", 1, frozenset({"gpu"})),
    "ecc_sbe": _Kind("COUNT", None, frozenset({"gpu"})),
    "gpu_lost": _Kind(None, None, frozenset({"gpu"})),
    "thermal": _Kind("CELSIUS", 94, frozenset({"gpu"})),
    "nvlink_errors": _Kind("COUNT", None, frozenset({"gpu", "gpu.nvlink"})),
    "nvlink_down": _Kind(None, None, frozenset({"gpu.nvlink"})),
    "ib_down": _Kind(None, None, frozenset({"nic"})),
    "ib_flap": _Kind("COUNT", 1, frozenset({"nic"})),
    "ib_symbol": _Kind("COUNT", None, frozenset({"nic"})),
    "ib_rcv": _Kind("COUNT", None, frozenset({"nic"})),
}
_TARGET = re.compile(
    r"gpu(\d{1,3})(?:\.nvlink(\d{1,3}))?|nic(\d{1,3})|pci=([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])"
)
_SHOWN = {"gpu": "gpuI", "gpu.nvlink": "gpuI.nvlinkN", "nic": "nicK", "pci": "pci=dddd:bb:dd.f"}
_DELAY = re.compile(r"\+(\d{1,7}(?:\.\d{1,6})?)")


@dataclass(frozen=True, slots=True)
class Fault:
    spec: str  # as given, for errors and logs
    kind: str
    arg: int | None = None
    gpu: int | None = None
    nvlink: int | None = None
    nic: int | None = None
    pci: str | None = None
    delay_s: float = 0.0


def parse_fault(spec: str) -> Fault:
    """One ``--inject`` value; InvalidInput names ``--inject``, the value and what was expected."""

    def bad(what: str) -> InvalidInput:
        return InvalidInput(_FIELD, spec, f"{what}; the form is {GRAMMAR}")

    parts = spec.strip().split("@")
    if len(parts) not in (2, 3) or not all(parts):
        raise bad("KIND[:ARG], a target and an optional delay, separated by '@'")
    head, target = parts[0], parts[1].lower()
    name, sep, arg_text = head.partition(":")
    kind = KINDS.get(name.lower())
    if kind is None:
        raise bad(f"a kind among {', '.join(KINDS)}")
    arg: int | None = kind.default
    if sep:
        if kind.arg is None:
            raise bad(f"no ARG for {name}")
        if not arg_text.isdigit() or len(arg_text) > 9:
            raise bad(f"{name}:{kind.arg} with {kind.arg} a whole number")
        arg = int(arg_text)
    elif kind.arg is not None and kind.default is None:
        raise bad(f"{name}:{kind.arg} ({kind.arg} is required)")
    if arg is not None and kind.arg == "COUNT" and arg < 1:
        raise bad(f"{name}:{kind.arg} of 1 or more")
    m = _TARGET.fullmatch(target)
    if m is None:
        raise bad("a target gpuI, gpuI.nvlinkN, nicK or pci=dddd:bb:dd.f")
    shape = "pci" if m[4] else "nic" if m[3] else "gpu.nvlink" if m[2] else "gpu"
    if shape not in kind.targets:
        raise bad(f"{name} at {' or '.join(_SHOWN[t] for t in sorted(kind.targets))}")
    delay = 0.0
    if len(parts) == 3:
        d = _DELAY.fullmatch(parts[2])
        if d is None:
            raise bad("a delay +SECONDS (e.g. @+30)")
        delay = float(d[1])
    return Fault(
        spec=spec,
        kind=name.lower(),
        arg=arg,
        gpu=int(m[1]) if m[1] else None,
        nvlink=int(m[2]) if m[2] else None,
        nic=int(m[3]) if m[3] else None,
        pci=m[4],
        delay_s=delay,
    )


class FaultInjector:
    """Applies ``faults`` to a simulated node when due. Call it after each agent tick (``Agent(inject=)``);
    the delays count from its first call, on ``clock``. Construction checks every fault against the node
    (GPU, NVLink and NIC indices exist; a ``pci=`` XID and NIC faults have their simulated surface)."""

    def __init__(
        self,
        faults: Sequence[Fault],
        clock: AgentClock,
        *,
        device: SimDevice,
        sysfs: SimSysfs | None = None,
        kernel_log: SimKernelLog | None = None,
    ) -> None:
        self.clock, self.device, self.sysfs, self.kernel_log = clock, device, sysfs, kernel_log
        for f in faults:
            self._check(f)
        self.pending = sorted(faults, key=lambda f: f.delay_s)
        self.fired: list[Fault] = []
        self._t0: float | None = None

    def __call__(self) -> list[Fault]:
        """Fire the faults that are due; returns them."""
        now = self.clock.monotonic()
        if self._t0 is None:
            self._t0 = now
        due = [f for f in self.pending if now - self._t0 >= f.delay_s]
        for f in due:
            self.pending.remove(f)
            self._apply(f)
            self.fired.append(f)
            log.info("simulated fault fired: %s", f.spec)
        return due

    def _check(self, f: Fault) -> None:
        gpus = len(self.device.state)
        if f.gpu is not None and not f.gpu < gpus:
            raise InvalidInput(_FIELD, f.spec, f"a GPU index below {gpus} (this node has {gpus} GPUs)")
        if f.gpu is not None and f.nvlink is not None:
            links = len(self.device.state[f.gpu].links)
            if not f.nvlink < links:
                raise InvalidInput(_FIELD, f.spec, f"an NVLink index below {links}")
        if f.nic is not None:
            if self.sysfs is None:
                raise InvalidInput(
                    _FIELD, f.spec, "NIC faults on the simulated InfiniBand tree (leave --ib-root unset)"
                )
            nics = len(self.sysfs.hcas())
            if not f.nic < nics:
                raise InvalidInput(_FIELD, f.spec, f"a NIC index below {nics} (--sim-nics)")
        if f.pci is not None and self.kernel_log is None:
            raise InvalidInput(_FIELD, f.spec, "a simulated kernel log for a pci= XID (--kmsg-path FILE)")

    def _apply(self, f: Fault) -> None:
        dev, arg = self.device, f.arg or 0
        match f.kind:
            case "xid" if f.pci is not None:
                assert self.kernel_log is not None
                self.kernel_log.xid(f.pci, arg)
            case "xid":
                dev.inject_xid(_req(f.gpu), arg)
            case "ecc_dbe":
                dev.add_ecc(_req(f.gpu), dbe=arg)
            case "ecc_sbe":
                dev.add_ecc(_req(f.gpu), sbe=arg)
            case "gpu_lost":
                dev.fall_off_bus(_req(f.gpu))
            case "thermal":
                dev.thermal_excursion(_req(f.gpu), float(arg))
            case "nvlink_errors":
                dev.add_nvlink_errors(_req(f.gpu), f.nvlink or 0, crc_flit=arg)
            case "nvlink_down":
                dev.nvlink_down(_req(f.gpu), _req(f.nvlink))
            case "ib_down":
                assert self.sysfs is not None
                self.sysfs.ib_down(_req(f.nic))
            case "ib_flap":
                assert self.sysfs is not None
                self.sysfs.ib_flap(_req(f.nic), arg)
            case "ib_symbol" | "ib_rcv":
                assert self.sysfs is not None
                counter = "symbol_error" if f.kind == "ib_symbol" else "port_rcv_errors"
                self.sysfs.add_to_counter(_req(f.nic), counter, arg)


def _req(v: int | None) -> int:
    assert v is not None  # parse_fault guarantees the target's parts for each kind
    return v
