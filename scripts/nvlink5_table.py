"""NVIDIA's "Xid 144-150 Decode" sheet as data, for ``build_xid_catalog.py``.

Source: the sheet "XID 144-150 Decode" of NVIDIA's Xid catalog workbook
(docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Xid-Catalog.xlsx), as transcribed in
leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go (generated 2025-10-29, commit
b9842de). One row per (Xid, unit, intrinfo pattern, error status). Patterns are 32 characters, bit 31
first; ``-`` is "any". ``v1`` is the layout printed by the 6-register form of the line, ``v2`` the
4-register form (low 7-8 bits name the unit); bits 20-25 of intrinfo are the subcode. The severity,
resolution, investigatory and hw/sw columns are NVIDIA's words; ``effect`` is their local/remote column
shortened; ``suspect`` is our reading of the investigatory column (docs/diagnose.md, "NVLink5").
"""

from __future__ import annotations

SOURCE = (
    "NVIDIA Xid catalog, sheet 'XID 144-150 Decode' (docs.nvidia.com/deploy/xid-errors/"
    "analyzing-xid-catalog.html), as transcribed in leptonai/gpud components/accelerator/nvidia/xid/"
    "catalog_generated.go @b9842de (2025-10-29)"
)

# Local/remote effect, NVIDIA's column shortened.
_EFFECT = {
    "A": "local: will lead to Xid 48, poison or Xid 94/95; remote: none",
    "B": "local: Xid 48; remote: poison or Xid 94",
    "F": "local: Xid 48, app crash (Xid 45); remote: possible packet loss",
    "H": "local: fatal; remote: possible/delayed packet loss",
    "L": "local: packet loss; remote: none",
    "N": "local: none; remote: none",
    "P": "local and remote: possible/delayed packet loss",
    "Q": "local and remote: possible/delayed packet loss; the other end of the link is the source",
    "R": "local: none; remote: packet loss",
    "T": "local: Xid 48, possible packet loss; remote: possible packet loss",
    "W": "local: fatal; remote: none",
    "X": "local: XC/app crash (Xid 45); remote: none",
    "Z": "not in production code: should not be seen",
}

# What the investigatory column points at -> detail ``suspect`` (comma-separated) for correlation.
SUSPECT = {
    "INVESTIGATE_PEER_DEVICE": "peer",
    "INVESTIGATE_LINK_SI_AND_CABLES": "cable",
    "INVESTIGATE_LINK_SI": "cable",
    "INVESTIGATE_SW_USER": "software",
    "INVESTIGATE_SW/USER": "software",
    "INVESTIGATE_SW_USER_LINK_SI": "software,cable",
    "INVESTIGATE_HOST": "host",
    "CONTACT_SUPPORT": "local",
    "REPORT_ISSUE (if seen >1 per day)": "local",
    "SYMPATHETIC_REPORT_SOLO": "sympathetic",
    "CHECK_NVLINK_FAILURE_FLOW": "link",
    "IGNORE": "",
}

NF, FA, LF = "Non-fatal", "Fatal", "Link Fatal"
IG, RG, CS, EV = "IGNORE", "RESET_GPU", "CONTACT_SUPPORT", "XID_154_EVAL"

# (xid, unit, v1 low bits, v2 low bits, [(subcode bits 20-25, error status, severity, resolution,
#   investigatory, hw/sw, effect key), ...])
_TLW_ROWS = [("000000", 0x1, NF, IG, IG, "HW", "N"), ("000000", 0x2, NF, IG, CS, "HW", "A"),
             ("000000", 0x4, FA, RG, CS, "HW", "T"), ("000000", 0x80000000, NF, IG, CS, "SW", "N")]
_LINK_DOWN = [
    ("000000", LF, RG, "SYMPATHETIC_REPORT_SOLO", "HW/SW", "P"),
    ("000001", LF, RG, "REPORT_ISSUE (if seen >1 per day)", "HW/SW", "P"),
    ("000010", LF, RG, "INVESTIGATE_LINK_SI", "HW/SW", "P"),
    ("000100", LF, RG, "INVESTIGATE_LINK_SI", "HW", "P"),
    ("001010", LF, RG, "INVESTIGATE_LINK_SI", "HW", "P"),
    ("001111", LF, RG, "INVESTIGATE_SW_USER", "SW", "P"),
    ("010000", LF, RG, "INVESTIGATE_SW_USER_LINK_SI", "SW", "P"),
    ("010001", LF, RG, "INVESTIGATE_SW_USER", "SW", "P"),
    ("010010", LF, RG, "INVESTIGATE_SW_USER_LINK_SI", "SW", "P"),
    ("010101", LF, RG, "INVESTIGATE_PEER_DEVICE", "HW/SW", "P"),
    ("010110", LF, RG, "INVESTIGATE_SW_USER", "SW", "P"),
    ("100000", LF, RG, "INVESTIGATE_PEER_DEVICE", "HW/SW", "Q"),
    ("100001", LF, RG, "INVESTIGATE_PEER_DEVICE", "HW/SW", "Q"),
    ("100010", LF, RG, "INVESTIGATE_PEER_DEVICE", "HW/SW", "Q"),
    ("100011", LF, RG, "INVESTIGATE_PEER_DEVICE", "HW", "Q"),
    ("100100", LF, RG, "INVESTIGATE_PEER_DEVICE", "HW/SW", "Q"),
    ("100101", LF, RG, "INVESTIGATE_PEER_DEVICE", "HW/SW", "Q"),
    ("100110", LF, IG, "INVESTIGATE_SW/USER", "HW/SW", "P"),
    ("101000", FA, IG, "INVESTIGATE_HOST", "SW", "H"),
    ("101010", "Link Fatal?", RG, "INVESTIGATE_LINK_SI_AND_CABLES", "HW", "P"),
    ("101011", "Link Fatal?", RG, "INVESTIGATE_LINK_SI_AND_CABLES", "HW", "P"),
]
_UNITS: list[tuple[int, str, str, str, list[tuple[str, int, str, str, str, str, str]]]] = [
    (144, "SAW_MVB", "0000100001", "0000001", [
        ("000000", 0x1, NF, IG, CS, "HW", "A"), ("000000", 0x2, FA, RG, CS, "HW", "F"),
        ("000000", 0x4, NF, IG, IG, "HW", "N"), ("000000", 0x8, NF, IG, CS, "HW", "B"),
        ("000000", 0x10, FA, RG, CS, "HW", "F"), ("000000", 0x20, NF, IG, IG, "HW", "N")]),
    (145, "RLW_CTRL", "0001100010", "0000011", [("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (145, "RLW_REMAP", "0010000010", "0000100", [
        ("000000", 0x1, NF, EV, CS, "SW", "X"), ("000000", 0x2, NF, EV, CS, "SW", "X"),
        *[("000000", s, NF, EV, "CHECK_NVLINK_FAILURE_FLOW", "SW", "X") for s in (0x4, 0x8, 0x10, 0x20)],
        ("000000", 0x40, FA, RG, CS, "HW", "F"), ("000000", 0x80, FA, RG, CS, "HW", "F"),
        ("000000", 0x100, NF, IG, IG, "HW", "N"), ("000000", 0x200, NF, IG, IG, "HW", "N"),
        ("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (145, "RLW_RSPCOL", "0010100010", "0000101", [
        ("000000", 0x1, NF, IG, IG, "HW", "N"), ("000000", 0x2, FA, RG, CS, "HW", "F"),
        ("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    # NVIDIA: "Non-fatal*" with a second action RESET_GPU for these three statuses.
    (145, "RLW_RXPIPE", "00011000010", "00000110", [
        ("000000", 0x1, "Non-fatal*", IG, CS, "SW", "R"), ("000000", 0x2, "Non-fatal*", IG, CS, "SW", "R"),
        ("000000", 0x4, "Non-fatal*", IG, CS, "SW", "L")]),
    (145, "RLW_RXPIPE", "0011000010", "0000110", [
        ("000000", 0x8, NF, IG, CS, "HW/SW", "N"), ("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (145, "RLW_SRC_TRACK", "0011100010", "0000111", [
        ("000000", 0x1, FA, RG, CS, "HW", "F"), ("000000", 0x2, NF, IG, IG, "HW", "N"),
        ("000000", 0x4, NF, EV, IG, "HW/SW", "X"), ("000000", 0x8, NF, EV, IG, "HW/SW", "X"),
        ("000000", 0x10, FA, RG, CS, "HW", "F"), ("000000", 0x20, FA, RG, CS, "HW", "F"),
        ("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (145, "RLW_TAGSTATE", "0100000010", "0001000", [
        ("000000", 0x1, NF, IG, IG, "HW", "N"), ("000000", 0x2, FA, RG, CS, "HW", "F"),
        ("000000", 0x10000, NF, IG, IG, "HW", "N"), ("000000", 0x20000, FA, RG, CS, "HW", "F"),
        ("000000", 0x100000, FA, RG, CS, "HW", "F"), ("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (146, "TLW_CTRL", "0100100011", "0001001", [
        ("000000", 0x1, NF, IG, IG, "HW", "N"), ("000000", 0x2, NF, IG, CS, "HW", "B"),
        ("000000", 0x4, FA, RG, CS, "HW", "T"), ("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (146, "TLW_RX/TLW_RX_PIPE0", "0101000011", "0001010", _TLW_ROWS),
    (146, "TLW_RX/TLW_RX_PIPE1", "0101000011", "0001011", _TLW_ROWS),
    (146, "TLW_TX/TLW_TX_PIPE0", "0101100011", "0001100", _TLW_ROWS),
    (146, "TLW_TX/TLW_TX_PIPE1", "0101100011", "0001101", _TLW_ROWS),
    (147, "TREX", "0110000100", "0001110", [
        ("000000", 0x1, NF, IG, CS, "SW", "Z"), ("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (148, "NVLPW_CTRL/NVLPW", "0000000101", "0001111", [("000000", 0x80000000, NF, IG, CS, "SW", "N")]),
    (149, "NETIR/NETIR_INT", "0000000110", "0011000", [
        ("000000", 0x0, LF, RG, "SYMPATHETIC_REPORT_SOLO", "HW/SW", "P")]),
    (149, "NETIR_BER_EVENT", "1000100110", "0010011", [
        ("000000", s, NF, IG, "INVESTIGATE_LINK_SI_AND_CABLES", "HW", "N") for s in (0x0, 0x1, 0x2, 0x3)]),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "0111000110", "0010001", [
        (sub, 0x0, sev, res, inv, hw, eff) for sub, sev, res, inv, hw, eff in _LINK_DOWN]),
    (149, "NETIR_MFDE_EVENT", "1001000110", "0010100", [
        ("000000", 0x1, "Fatal**", RG, CS, "HW/SW", "H"), ("000000", 0x3, NF, IG, IG, "NA", "N"),
        *[("000000", s, "Fatal**", RG, CS, "HW/SW", "H") for s in (0x4, 0x5, 0x7)]]),
    (150, "MSE_WATCHDOG", "0000000000", "0000000", [("000000", 0x0, FA, RG, CS, "FW", "W")]),
]

FIELDS = ["xid", "unit", "intrinfo_v1", "intrinfo_v2", "error_status", "severity", "resolution",
          "investigatory", "hw_sw", "effect", "suspect", "source"]


def _pattern(sub: str, low: str) -> str:
    return "------" + sub + "-" * (20 - len(low)) + low


def rows() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for xid, unit, v1, v2, entries in _UNITS:
        for sub, status, sev, res, inv, hw, eff in entries:
            out.append({"xid": xid, "unit": unit, "intrinfo_v1": _pattern(sub, v1),
                        "intrinfo_v2": _pattern(sub, v2), "error_status": f"0x{status:08x}",
                        "severity": sev, "resolution": res, "investigatory": inv, "hw_sw": hw,
                        "effect": _EFFECT[eff], "suspect": SUSPECT[inv], "source": SOURCE})
    return out
