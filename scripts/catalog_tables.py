"""Facts for the SXid, PCIe AER and code-less catalogs, with gpufleet's judgement beside each row.

Used by ``build_xid_catalog.py``. Each table names its source; severity/action are our own reading.
"""

from __future__ import annotations

FM_GUIDE = (
    "NVIDIA Fabric Manager User Guide DU-09883-001 v1.3 App. D (as encoded in leptonai/gpud "
    "components/accelerator/nvidia/sxid/sxid.go @09b59a5)"
)

# (code, name, class) — class: nonfatal | potential (D.5) | always (D.6) | other
_SXID: list[tuple[int, str, str]] = [
    (11004, "Ingress invalid ACL", "config"),
    (11012, "Single bit ECC errors", "nonfatal"),
    (11021, "Single bit ECC errors", "nonfatal"),
    (11022, "Single bit ECC errors", "nonfatal"),
    (11023, "Single bit ECC errors", "nonfatal"),
    (12021, "Single bit ECC errors", "nonfatal"),
    (12023, "Single bit ECC errors", "nonfatal"),
    (15008, "Single bit ECC errors", "nonfatal"),
    (15011, "Single bit ECC errors", "nonfatal"),
    (19049, "Single bit ECC errors", "nonfatal"),
    (19055, "Single bit ECC errors", "nonfatal"),
    (19057, "Single bit ECC errors", "nonfatal"),
    (19059, "Single bit ECC errors", "nonfatal"),
    (19062, "Single bit ECC errors", "nonfatal"),
    (19065, "Single bit ECC errors", "nonfatal"),
    (19068, "Single bit ECC errors", "nonfatal"),
    (19071, "Single bit ECC errors", "nonfatal"),
    (24001, "Single bit ECC errors", "nonfatal"),
    (24002, "Single bit ECC errors", "nonfatal"),
    (24003, "Single bit ECC errors", "nonfatal"),
    (20001, "TX Replay Error", "nonfatal"),
    (20009, "RX Short Error Rate", "nonfatal"),
    (22013, "Minion Link DLREQ interrupt", "nonfatal"),
    (20012, "Broken/inconsistent connection", "mechanical"),
    (12028, "egress nonposted PRIV error", "reboot"),
    (19084, "AN1 Heartbeat Timeout Error", "reboot"),
    (11001, "ingress invalid command", "potential"),
    (11009, "ingress invalid VCSet", "potential"),
    (11013, "ingress header DBE", "potential"),
    (11018, "ingress RID DBE", "potential"),
    (11019, "ingress RLAN DBE", "potential"),
    (11020, "ingress control parity", "potential"),
    (12001, "egress crossbar overflow", "potential"),
    (12002, "egress packet route", "potential"),
    (12022, "egress input ECC DBE error", "potential"),
    (12024, "egress output ECC DBE error", "potential"),
    (12025, "egress credit overflow", "potential"),
    (12026, "egress destination request ID error", "potential"),
    (12027, "egress destination response ID error", "potential"),
    (12030, "egress control parity error", "potential"),
    (12031, "egress credit parity error", "potential"),
    (12032, "egress flit type mismatch", "potential"),
    (14017, "TS ATO timeout", "potential"),
    (15001, "route buffer over/underflow", "potential"),
    (15006, "route transdone over/underflow", "potential"),
    (15009, "route GLT DBE", "potential"),
    (15010, "route parity", "potential"),
    (15012, "route incoming DBE", "potential"),
    (15013, "route credit parity", "potential"),
    (19047, "NCISOC HDR ECC DBE Error", "potential"),
    (19048, "NCISOC DAT ECC DBE Error", "potential"),
    (19054, "HDR RAM ECC DBE Error", "potential"),
    (19056, "DAT0 RAM ECC DBE Error", "potential"),
    (19058, "DAT1 RAM ECC DBE Error", "potential"),
    (19060, "CREQ RAM HDR ECC DBE Error", "potential"),
    (19061, "CREQ RAM DAT ECC DBE Error", "potential"),
    (19063, "Response RAM HDR ECC DBE Error", "potential"),
    (19064, "Response RAM DAT ECC DBE Error", "potential"),
    (19066, "COM RAM HDR ECC DBE Error", "potential"),
    (19067, "COM RAM DAT ECC DBE Error", "potential"),
    (19069, "RSP1 RAM HDR ECC DBE Error", "potential"),
    (19070, "RSP1 RAM DAT ECC DBE Error", "potential"),
    (20034, "LTSSM Fault Up", "potential"),
    (22012, "Minion Link NA interrupt", "potential"),
    (24004, "sourcetrack TCEN0 crumbstore DBE", "potential"),
    (24005, "sourcetrack TCEN0 TD crumbstore DBE", "potential"),
    (24006, "sourcetrack TCEN1 crumbstore DBE", "potential"),
    (24007, "sourcetrack timeout error", "potential"),
    (12020, "egress sequence ID error", "always"),
    (22003, "Minion Halt", "always"),
    (22011, "Minion exterror", "always"),
    (23001, "ingress SRC-VC buffer overflow", "always"),
    (23002, "ingress SRC-VC buffer underflow", "always"),
    (23003, "egress DST-VC credit overflow", "always"),
    (23004, "egress DST-VC credit underflow", "always"),
    (23005, "ingress packet burst error", "always"),
    (23006, "ingress packet sticky error", "always"),
    (23007, "possible bubbles at ingress", "always"),
    (23008, "ingress packet invalid dst error", "always"),
    (23009, "ingress packet parity error", "always"),
    (23010, "ingress SRC-VC buffer overflow", "always"),
    (23011, "ingress SRC-VC buffer underflow", "always"),
    (23012, "egress DST-VC credit overflow", "always"),
    (23013, "egress DST-VC credit underflow", "always"),
    (23014, "ingress packet burst error", "always"),
    (23015, "ingress packet sticky error", "always"),
    (23016, "possible bubbles at ingress", "always"),
    (23017, "ingress credit parity error", "always"),
    (10001, "Host_priv_error", "host"),
    (10002, "Host_priv_timeout", "host"),
    (10003, "Host_unhandled_interrupt", "always"),
    (10004, "Host_thermal_event_start", "thermal"),
    (10005, "Host_thermal_event_end", "info"),
]

# class -> (meaning, NVIDIA resolution, severity, action)
_SXID_CLASS: dict[str, tuple[str, str, str, str]] = {
    "nonfatal": ("non-fatal: corrected by the NVSwitch (SBE, replay, short error rate)",
                 "Non-fatal (D.3): not applicable", "info", "none"),
    "config": ("fabric partition routing misconfigured; NVLink traffic of the GPU stalls (Xid 45)",
               "Validate routing with NVSwitch-audit; restart guest VM", "degraded", "contact_support"),
    "mechanical": ("broken or inconsistent NVLink connection or uncoordinated shutdown",
                   "Check link mechanical connections", "degraded", "check_cabling"),
    "reboot": ("NVSwitch error that stalls the GPU's NVLink traffic", "Reset all GPUs and NVSwitches",
               "fatal", "reboot"),
    "potential": ("potentially fatal (D.5): on an access port only that GPU's partition fails; on a "
                  "trunk port every partition crossing it; propagated to the GPU as Xid 74",
                  "D.5: restart the guest VM / reset GPU; repeat -> inspect NVSwitch", "fatal", "reboot"),
    "always": ("always fatal (D.6) to the whole NVLink fabric", "D.6: restart the host (or SBR all "
               "NVSwitches and GPUs)", "fatal", "reboot"),
    "host": ("host-side NVSwitch access error; may be followed by fatal events", "Other notable SXid",
             "degraded", "contact_support"),
    "thermal": ("NVSwitch thermal event: links may drop to single-lane mode", "Ensure sufficient cooling",
                "degraded", "drain_and_inspect"),
    "info": ("thermal event ended", "Ensure sufficient cooling", "info", "none"),
}


def sxid_rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for code, name, cls in _SXID:
        meaning, resolution, sev, action = _SXID_CLASS[cls]
        out.append({"kind": "sxid", "code": code, "name": name, "meaning": meaning,
                    "nvidia_resolution": resolution, "severity": sev, "action": action,
                    "component": "NVSwitch port/link", "collateral": "", "source": FM_GUIDE})
    return out


AER_SOURCE = (
    "Linux drivers/pci/pcie/aer.c (aer_correctable_error_string / aer_uncorrectable_error_string); "
    "bit meanings: PCI Express Base Specification, AER capability status registers"
)

# bit -> (short name as printed by the kernel, meaning)
_AER_CORRECTED: list[tuple[int, str, str]] = [
    (0, "RxErr", "receiver error: physical-layer symbol errors on the link"),
    (6, "BadTLP", "bad TLP: LCRC or sequence-number error, packet replayed"),
    (7, "BadDLLP", "bad DLLP: data-link packet CRC error"),
    (8, "Rollover", "REPLAY_NUM rollover: a packet was replayed four times"),
    (12, "Timeout", "replay timer timeout: the link partner did not acknowledge in time"),
    (13, "NonFatalErr", "advisory non-fatal error (an uncorrectable error handled as correctable)"),
    (14, "CorrIntErr", "corrected internal error in the device"),
    (15, "HeaderOF", "header log overflow"),
]
_AER_UNCORRECTED: list[tuple[int, str, str, str, str]] = [
    # bit, name, meaning, severity, action
    (0, "Undefined", "undefined (training error on PCIe 1.0 devices)", "degraded", "drain_and_inspect"),
    (4, "DLP", "data link protocol error", "fatal", "drain_and_inspect"),
    (5, "SDES", "surprise down: the link went down unexpectedly (device lost)", "fatal", "reboot"),
    (12, "TLP", "poisoned TLP: data was known bad when sent", "degraded", "drain_and_inspect"),
    (13, "FCP", "flow-control protocol error", "fatal", "drain_and_inspect"),
    (14, "CmpltTO", "completion timeout: a request to the device got no answer", "degraded",
     "drain_and_inspect"),
    (15, "CmpltAbrt", "completer abort", "degraded", "drain_and_inspect"),
    (16, "UnxCmplt", "unexpected completion", "degraded", "drain_and_inspect"),
    (17, "RxOF", "receiver overflow", "fatal", "drain_and_inspect"),
    (18, "MalfTLP", "malformed TLP", "fatal", "drain_and_inspect"),
    (19, "ECRC", "end-to-end CRC error", "degraded", "drain_and_inspect"),
    (20, "UnsupReq", "unsupported request", "info", "none"),
    (21, "ACSViol", "ACS violation", "degraded", "contact_support"),
    (22, "UncorrIntErr", "uncorrectable internal error in the device", "fatal", "drain_and_inspect"),
    (23, "BlockedTLP", "MC blocked TLP", "degraded", "contact_support"),
    (24, "AtomicOpBlocked", "AtomicOp egress blocked", "degraded", "contact_support"),
    (25, "TLPBlockedErr", "TLP prefix blocked", "degraded", "contact_support"),
    (26, "PoisonTLPBlocked", "poisoned TLP egress blocked", "degraded", "contact_support"),
]


def aer_rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for bit, name, meaning in _AER_CORRECTED:
        out.append({"kind": "aer_corrected", "code": bit, "name": name, "meaning": meaning,
                    "nvidia_resolution": "", "severity": "info", "action": "none",
                    "component": "PCIe link (slot, riser, retimer, cable)", "collateral": "",
                    "source": AER_SOURCE})
    for bit, name, meaning, sev, action in _AER_UNCORRECTED:
        out.append({"kind": "aer_uncorrected", "code": bit, "name": name, "meaning": meaning,
                    "nvidia_resolution": "", "severity": sev, "action": action,
                    "component": "PCIe link or device", "collateral": "", "source": AER_SOURCE})
    return out


OWN = "gpufleet judgement (docs/diagnose.md)"

# Kinds whose log lines carry no code: one default row each (code empty). The decoder may raise the
# severity when the line itself states something worse (e.g. an EDAC "UE", an mlx5 "unrecoverable").
_EVENTS: list[tuple[str, str, str, str, str, str, str]] = [
    ("aer_corrected", "AER corrected", "PCIe corrected error (no status bit decoded)", "info", "none",
     "PCIe link", AER_SOURCE),
    ("aer_uncorrected", "AER uncorrected", "PCIe uncorrectable error (no status bit decoded)",
     "degraded", "drain_and_inspect", "PCIe link or device", AER_SOURCE),
    ("nvlink", "NVLink error", "NVLink link training/discovery failure reported without an Xid",
     "degraded", "reboot", "NVLink (GPU port, NVSwitch, cable cartridge)",
     "leptonai/gpud PR #1271/#1272 (knvlink postRxDetLinkMask failures); " + OWN),
    ("ib_link", "NIC link event", "InfiniBand/Ethernet port lost link, or a cable/module event",
     "degraded", "check_cabling", "NIC port, cable or transceiver",
     "Linux drivers/net/ethernet/mellanox/mlx5/core/events.c (port module events); NVIDIA/NVSentinel "
     "syslog-health-monitor NIC patterns; " + OWN),
    ("mce_edac", "Machine check / EDAC", "host CPU/DRAM machine-check or EDAC memory error",
     "info", "none", "host DIMM or CPU", "Linux arch/x86 mce and drivers/edac messages; " + OWN),
    ("oom", "OOM kill", "the kernel killed a process for lack of memory", "info", "restart_app",
     "application / host memory sizing", OWN),
    ("gpu_lost", "GPU lost", "GPU fell off the bus or failed to initialise; it is unusable",
     "fatal", "reboot", "GPU, PCIe slot/riser, power", "NVIDIA/NVSentinel issue #155; " + OWN),
    ("crash_dump", "GPU crash dump", "the driver wrote a GPU crash dump (follows another error)",
     "info", "none", "follows another error", OWN),
    ("kernel", "Kernel stall", "hung task, soft lockup or RCU stall: the kernel stopped scheduling work",
     "degraded", "drain_and_inspect", "host kernel, a driver, or the hardware under it",
     "Linux kernel/hung_task.c, kernel/watchdog.c, kernel/rcu/tree_stall.h messages; " + OWN),
    ("kernel_oops", "Kernel oops",
     "the kernel hit a bug or a bad memory access (oops, BUG, general protection fault) and killed the "
     "task; it runs on tainted", "degraded", "drain_and_inspect",
     "host kernel or a driver (see the faulting module)",
     "Linux arch/x86/mm/fault.c, arch/arm64/mm/fault.c, arch/x86/kernel/traps.c, lib/bug.c messages; " + OWN),
    ("kernel_panic", "Kernel panic", "the kernel panicked or a CPU hard-locked: the node is down",
     "fatal", "reboot", "host kernel or hardware (see the panic reason)",
     "Linux kernel/panic.c, kernel/watchdog_perf.c messages; " + OWN),
    ("peermem", "nvidia-peermem error", "GPUDirect RDMA (nvidia-peermem) reported an error",
     "info", "none", "GPUDirect RDMA: nvidia-peermem / NIC driver",
     "NVIDIA nvidia-peermem messages (nv_get_p2p_free_callback); leptonai/gpud peermem component; " + OWN),
]


def event_rows() -> list[dict[str, object]]:
    return [
        {"kind": kind, "code": "", "name": name, "meaning": meaning, "nvidia_resolution": "",
         "severity": sev, "action": action, "component": comp,
         "collateral": "yes" if kind == "crash_dump" else "", "source": src}
        for kind, name, meaning, sev, action, comp, src in _EVENTS
    ]
