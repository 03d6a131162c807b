"""Build the shipped fault catalogs under src/gpufleet/domain/data/.

* ``xid_catalog.csv`` from ../shared/reference/xid-catalog.csv. The reference table carries NVIDIA's
  facts (name, meaning, resolution buckets, source). This script adds gpufleet's judgement — a
  lifecycle severity and a recommended action — by a documented rule on NVIDIA's *immediate*
  resolution bucket, with a short list of per-code exceptions (each commented).
* ``sxid_catalog.csv`` (NVSwitch SXid classes), ``aer_catalog.csv`` (PCIe AER status bits) and
  ``events_catalog.csv`` (kinds whose log lines carry no code) from the tables in
  ``scripts/catalog_tables.py``.

Run it again when a source table changes; the output is committed as package data.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import catalog_tables
import nvlink5_table

# NVIDIA immediate bucket -> (severity, action)
BUCKET_RULE = {
    "RESTART_APP": ("info", "restart_app"),  # application-scoped: the job restarts, the node is fine
    "IGNORE": ("info", "none"),
    "XID_154": ("info", "none"),  # informational: recovery action changed
    "CHECK_UVM": ("info", "restart_app"),
    "WORKFLOW_XID_45": ("info", "none"),  # collateral of another XID: follow that one
    "RESET_GPU": ("fatal", "reset_gpu"),  # the GPU is unusable until reset: running work is lost
    "RESTART_BM": ("fatal", "reboot"),
    "RESTART_VM": ("fatal", "reboot"),
    "WORKFLOW_XID_48": ("fatal", "reset_gpu"),  # uncorrectable ECC
    "WORKFLOW_NVLINK_ERR": ("fatal", "drain_and_inspect"),  # XID 74: the NVLink job fails
    # NVLink5 (144-150): judged per subcode. The decoder states each line's severity from NVIDIA's
    # "Xid 144-150 Decode" sheet (nvlink5_decode.csv), which raises fatal rows; the row is the floor for
    # sources that carry no subcode (NVML reports the code only): degraded, with NVIDIA's resolution of
    # every fatal row, RESET_GPU, as the action (decision record 0030).
    "WORKFLOW_NVLINK5_ERR": ("degraded", "reset_gpu"),
    "CONTACT_SUPPORT": ("degraded", "contact_support"),
    "CHECK_MECHANICALS": ("degraded", "check_cabling"),
    "UPDATE_SWFW": ("degraded", "update_software"),
}
NO_BUCKET = ("degraded", "contact_support")  # codes NVIDIA has not yet classified: look at them

# Per-code exceptions to the bucket rule, each with its reason.
OVERRIDES = {
    # Contained uncorrectable memory error: the job restarts, but a row remap is pending and only a
    # GPU reset applies it -> drain at the next checkpoint; two in 24 h escalate (policy file).
    94: ("degraded", "reset_gpu"),
    # Row remap recorded: the remap applies at the next reset; schedule one, do not kill work.
    63: ("degraded", "reset_gpu"),
    # Row-remap recording failed: RMA candidate.
    64: ("fatal", "replace"),
    # High SBE rate: a leading indicator of HBM failure; watch, do not drain.
    92: ("degraded", "none"),
    # C2C link error on Grace-Hopper/Blackwell: the superchip link is unreliable.
    121: ("degraded", "drain_and_inspect"),
    # Power-smoothing circuitry exhausted / reduced memory capacity: hardware wear-out.
    165: ("degraded", "replace"),
    168: ("degraded", "replace"),
    # PCIe fatal timeout and SEC2 halt: the GPU stops working.
    167: ("fatal", "reboot"),
    169: ("fatal", "reset_gpu"),
    # Detail codes for XID 48 (DRAM vs SRAM uncorrectable).
    171: ("fatal", "reset_gpu"),
    172: ("fatal", "reset_gpu"),
    # Power-smoothing engage/disengage and CC-mode notices are informational.
    162: ("info", "none"),
    163: ("info", "none"),
    164: ("degraded", "none"),
    166: ("info", "none"),
    170: ("info", "none"),
}


# Codes newer than the reference table (NVIDIA adds codes with each driver branch), each with its
# source and our judgement. Refresh: docs/diagnose.md, "Refreshing the catalog".
NEWER_CODES: list[dict[str, object]] = [
    {"code": 173, "name": "C2C_FATAL_LINK_FAILURE",
     "meaning": "fatal failure of the chip-to-chip (C2C) link between Grace CPU and Blackwell GPU (GB200)",
     "nvidia_resolution": "immediate=n/a (no bucket in the transcription); investigatory=n/a",
     # The superchip's CPU-GPU link is down: the GPU is unreachable until the node is restarted.
     "severity": "fatal", "action": "reboot", "component": "Grace-Blackwell C2C link",
     "source": "leptonai/gpud components/accelerator/nvidia/xid/xid.go (173 'C2C Fatal Link Failure', "
               "NVIDIA Xid catalog R580); NVIDIA Xid catalog docs.nvidia.com/deploy/xid-errors/"
               "analyzing-xid-catalog.html"},
]

FIELDS = ["kind", "code", "name", "meaning", "nvidia_resolution", "severity", "action", "component",
          "collateral", "source"]


def write_rows(dst: Path, rows: list[dict[str, object]]) -> None:
    with dst.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} rows to {dst}")


def main(src: Path, dst: Path) -> None:
    rows = list(csv.DictReader(src.open()))
    out = []
    for r in rows:
        code = int(r["code"])
        bucket = r["recommended_action"].split(";")[0].split("=", 1)[1].strip()
        sev, action = OVERRIDES.get(code) or BUCKET_RULE.get(bucket, NO_BUCKET)
        name, _, meaning = r["name"].partition(":")
        out.append(
            {
                "kind": "xid",
                "code": code,
                "name": name.strip(),
                "meaning": meaning.strip(),
                "nvidia_resolution": r["recommended_action"],
                "severity": sev,
                "action": action,
                "component": r["likely_component"],
                # 45: channel torn down because of an earlier Xid; 154: recovery-action notice about another Xid.
                "collateral": "yes" if code in (45, 154) else "",
                "source": r["source"],
            }
        )
    known = {int(r["code"]) for r in rows}
    for extra in NEWER_CODES:
        if int(extra["code"]) not in known:  # type: ignore[call-overload]
            out.append({"kind": "xid", "collateral": "", **extra})
    write_rows(dst, out)  # type: ignore[arg-type]
    data = dst.parent
    write_rows(data / "sxid_catalog.csv", catalog_tables.sxid_rows())
    write_rows(data / "aer_catalog.csv", catalog_tables.aer_rows())
    write_rows(data / "events_catalog.csv", catalog_tables.event_rows())
    write_table(data / "nvlink5_decode.csv", nvlink5_table.FIELDS, nvlink5_table.rows())


def write_table(dst: Path, fields: list[str], rows: list[dict[str, object]]) -> None:
    with dst.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} rows to {dst}")


if __name__ == "__main__":
    here = Path(__file__).resolve().parent.parent
    main(
        Path(sys.argv[1]) if len(sys.argv) > 1 else here.parent / "shared/reference/xid-catalog.csv",
        here / "src/gpufleet/domain/data/xid_catalog.csv",
    )
