"""From a :class:`Finding` to the fleet's one currency, :class:`HealthEvent`.

Mapping (docs/diagnose.md, "Events"):

==========  =====================================================================================
finding     HealthEvent kind
==========  =====================================================================================
xid         XID (code kept)
sxid        SXID (code kept; the NVSwitch's PCI address is the component unless a slot is given)
aer         AER_CORRECTED or AER_UNCORRECTED (by the kernel's class; code = AER status bit)
gpu_lost    GPU_LOST
ib_link     LINK_DOWN (port down), LINK_FLAP (down again after recovering), LINK_ERROR (cable,
            module or device error)
nvlink      LINK_ERROR (an NVLink failure without an Xid)
mce_edac    CHECK_FAILED with ``attrs`` check=host_memory, when degraded or fatal; None when info
            (a corrected DIMM error alone changes nothing)
kernel      CHECK_FAILED with ``attrs`` check=host_kernel (panic, hung task, lockup); None for an
            nvidia-peermem error (stated info)
oom         None (an application event, not a hardware one)
crash_dump  None (it always follows another finding, which is the event)
==========  =====================================================================================

The event is an *observation*: it carries only what the line itself stated (``severity`` =
:attr:`Finding.stated`, usually None), never the catalog's judgement — the controller judges it once
with the site's catalog (:func:`gpufleet.domain.judgement.judge`). ``attrs.rule`` names the catalog
kind the line was recognised as when it differs from the event kind (``nvlink``, ``ib_link``,
``mce_edac``, ``aer``), so the controller judges it by the same entry ``gpufleet diagnose`` uses. The
NVLink number goes to ``attrs.nvlink`` and a NIC port to ``attrs.port``, not to ``HealthEvent.link``:
that field names a topology link id, which the controller's identity mapping fills in.
"""

from __future__ import annotations

from datetime import datetime

from gpufleet.diagnose.finding import Finding, FindingKind
from gpufleet.domain.events import EventKind, HealthEvent, Severity, utc

# Detail keys the controller and the correlator read: NVLink5 subcode decode (``suspect`` = peer, cable,
# software, host, local, ...; ``unit``, ``subcode``, ``error_status``, ``hw_sw``; ``nvl5_row``, the decode
# row the controller judges the event by: decision 0031), an SXid's switch number and the GPU on the far
# end of its port (``nvswitch``, ``peer_gpu``, ``peer_nvlink``), the MIG instance, the
# event of a code-less kind, and the ones kept before.
_FORWARDED = frozenset({"port", "reporter", "recovery_to", "uuid", "suspect", "unit", "subcode", "error_status",
                        "nvl5_row", "hw_sw", "gpu_instance", "compute_instance", "event", "address", "nvswitch",
                        "peer_gpu", "peer_nvlink"})


def event_kind_for(finding: Finding) -> EventKind | None:
    """The HealthEvent kind a finding maps to (see the table above), or None."""
    match finding.kind:
        case FindingKind.XID:
            return EventKind.XID
        case FindingKind.SXID:
            return EventKind.SXID
        case FindingKind.AER:
            corrected = finding.catalog_kind == "aer_corrected"
            return EventKind.AER_CORRECTED if corrected else EventKind.AER_UNCORRECTED
        case FindingKind.GPU_LOST:
            return EventKind.GPU_LOST
        case FindingKind.IB_LINK:
            event = finding.get("event")
            if event == "link_down":
                return EventKind.LINK_DOWN
            return EventKind.LINK_FLAP if event == "link_flap" else EventKind.LINK_ERROR
        case FindingKind.NVLINK:
            return EventKind.LINK_ERROR
        case FindingKind.MCE_EDAC | FindingKind.KERNEL:  # only when the line says it is not benign
            return None if finding.stated in (None, Severity.INFO) else EventKind.CHECK_FAILED
        case _:
            return None


def finding_to_event(
    finding: Finding,
    node: str,
    *,
    id: str,
    gpu_slot: str | None = None,
    fallback_time: datetime | None = None,
    source: str = "diagnose",
) -> HealthEvent | None:
    """The HealthEvent for ``finding`` on ``node``, or None when the finding maps to none (see the
    module table) or has no time and no ``fallback_time`` was given.

    ``id`` is the caller's idempotency key (e.g. boot id + kmsg sequence number). ``gpu_slot``
    names the component (``r01-n03-gpu5``) when the caller maps the PCI address to a slot; otherwise
    the normalised PCI address is the component. ``fallback_time`` is used for findings whose log
    line had no wall-clock time (plain dmesg without a boot time). ``source`` names the observer (the
    agent's kernel-log follower says ``kmsg``: the controller merges its XIDs with NVML's).
    """
    kind = event_kind_for(finding)
    if kind is None:
        return None
    when = finding.time or fallback_time
    if when is None:
        return None
    attrs: list[tuple[str, str]] = [("line", str(finding.line))]
    if finding.catalog_kind != kind.value:  # the catalog key the line was recognised as (nvlink, ib_link, ...)
        attrs.append(("rule", finding.catalog_kind))
    if finding.pci:
        attrs.append(("pci", finding.pci))
    if kind is EventKind.CHECK_FAILED:
        attrs.append(("check", "host_kernel" if finding.kind is FindingKind.KERNEL else "host_memory"))
    if finding.escalated:
        attrs.append(("escalated", finding.escalated))
    for k, v in finding.detail:
        if k in _FORWARDED:
            attrs.append((k, v))
        elif k == "link":  # a GPU's NVLink number or a switch port, not a topology link id
            attrs.append(("nvlink" if finding.kind in (FindingKind.NVLINK, FindingKind.XID) else "port", v))
    return HealthEvent(
        id=id,
        node=node,
        kind=kind,
        time=utc(when),
        component=gpu_slot or finding.pci,
        code=finding.code,
        severity=finding.stated,
        message=f"{finding.name}: {finding.raw.splitlines()[0] if finding.raw else ''}"[:500],
        source=source,
        attrs=tuple(attrs),
    )
