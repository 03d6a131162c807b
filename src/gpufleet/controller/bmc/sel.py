"""BMC System Event Log entries -> health event observations (judged by the controller, once).

A Redfish ``LogEntry`` (``EntryType`` ``SEL`` or ``Event``) says what happened (``Message``), to which
sensor class (``SensorType``: the IPMI sensor types Redfish enumerates), how bad the BMC thinks it is
(``Severity``: OK / Warning / Critical) and whether the condition began or ended (``EntryCode``:
``Assert`` / ``Deassert``). gpufleet keeps the **hardware** classes a GPU node's health depends on and
names the rule the catalog judges (``rules_catalog.csv``, source ``bmc``):

| SensorType / message | kind | rule |
|---|---|---|
| Power Supply / Converter, Power Unit | check_failed | ``bmc_psu`` |
| Fan | thermal | ``bmc_fan`` |
| Temperature | thermal | ``bmc_thermal`` |
| Memory, Critical: uncorrectable | check_failed | ``bmc_memory_ue`` |
| Memory, otherwise (correctable) | check_failed | ``bmc_memory_ce`` (info) |
| PCIe / Critical Interrupt / Bus, Critical | aer_uncorrected | ``bmc_pcie_fatal`` |
| PCIe / Critical Interrupt / Bus, otherwise | aer_corrected | ``bmc_pcie`` (info) |

Deasserts and ``OK`` entries (a condition that ended, a log cleared, an informational line) and other
sensor classes (watchdog, OS boot, ...) are not health events. The event's id is
``<node>:bmc:<log service>:<entry id>:<created>`` — the SEL's own id plus its time, so the same entry
read again (every poll, after a controller restart) is the same event for the store's
``(node, id)`` dedup, and an entry id the BMC reuses after the SEL was cleared is a new one.
The BMC's severity is kept in ``attrs.bmc_severity``, never stated as the event's severity: the
catalog judges.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpufleet.domain.events import EventKind, HealthEvent, utc

SOURCE = "bmc"
_PSU = ("power supply", "power unit", "psu")
_PCIE = ("pci", "critical interrupt", "bus")


def classify(entry: Mapping[str, Any]) -> tuple[EventKind, str] | None:
    """(kind, rule) for a hardware entry worth a health event, else None."""
    severity = str(entry.get("Severity") or "").lower()
    code = str(entry.get("EntryCode") or "").lower()
    if severity in ("", "ok") or code == "deassert":
        return None
    sensor = str(entry.get("SensorType") or "").lower()
    text = f"{sensor} {str(entry.get('Message') or '').lower()}"
    critical = severity == "critical"
    if any(w in sensor for w in _PSU) or (not sensor and any(w in text for w in _PSU)):
        return EventKind.CHECK_FAILED, "bmc_psu"
    if "fan" in sensor or (not sensor and " fan" in f" {text}"):
        return EventKind.THERMAL, "bmc_fan"
    if "temperature" in sensor or (not sensor and ("temperature" in text or "thermal" in text)):
        return EventKind.THERMAL, "bmc_thermal"
    if "memory" in sensor or (not sensor and ("memory" in text or "dimm" in text or "ecc" in text)):
        ue = critical or "uncorrectable" in text
        return EventKind.CHECK_FAILED, "bmc_memory_ue" if ue else "bmc_memory_ce"
    if any(w in sensor for w in _PCIE) or (not sensor and ("pcie" in text or "pci " in text)):
        return (EventKind.AER_UNCORRECTED, "bmc_pcie_fatal") if critical else (EventKind.AER_CORRECTED, "bmc_pcie")
    return None


def entry_event(node: str, entry: Mapping[str, Any], *, fallback_time: datetime) -> HealthEvent | None:
    """The observation for one SEL entry of ``node``'s BMC (None: not a hardware health event)."""
    got = classify(entry)
    if got is None:
        return None
    kind, rule = got
    created = str(entry.get("Created") or "")
    try:
        time = utc(datetime.fromisoformat(created.replace("Z", "+00:00"))) if created else fallback_time
    except ValueError:
        time = fallback_time
    service = str(entry.get("LogService") or "log")
    entry_id = str(entry.get("Id") or "")
    attrs = {"rule": rule, "bmc_entry": entry_id, "bmc_log": service,
             "bmc_severity": str(entry.get("Severity") or ""), "sensor": str(entry.get("SensorType") or ""),
             "bmc_message_id": str(entry.get("MessageId") or ""), "sensor_number": str(entry.get("SensorNumber") or "")}
    return HealthEvent(
        id=f"{node}:bmc:{service}:{entry_id}:{created or 'undated'}",
        node=node, kind=kind, time=time,
        message=f"BMC SEL: {str(entry.get('Message') or '').strip()[:400]}",
        source=SOURCE, attrs=tuple(sorted((k, v) for k, v in attrs.items() if v)))
