"""Decision 0031: a decoded NVLink5 subcode row is a catalog entry more specific than its Xid's.

The rows are NVIDIA's "Xid 144-150 Decode" sheet (domain/data/nvlink5_decode.csv); the Xid's own entry
(xid_catalog.csv) stays the floor for an Xid seen without a decode (NVML reports the code only).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from gpufleet.controller.admission import Admission
from gpufleet.diagnose.decoder import Decoder
from gpufleet.diagnose.events import finding_to_event
from gpufleet.domain.catalog import Action, Catalog, load_default_catalog
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import judge, judge_event
from gpufleet.domain.nodestatus import NodeStatus, Observation, parse_status, verdict

CAT: Catalog = load_default_catalog()
BER = "NETIR_BER_EVENT:0x00000001:000000"  # Non-fatal, IGNORE; investigate link SI and cables
PEER_DOWN = "NETIR_LINK_EVT/NETIR_LINK_DOWN:0x00000000:100001"  # Link Fatal, RESET_GPU; the peer device
BER_LINE = ("[ 12.5] NVRM: Xid (PCI:0000:04:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 00 "
            "(0x00000013 0x00000001 0x00000000 0x00000000)")


def _event(row: str, severity: Severity | None = None, code: int = 149) -> HealthEvent:
    attrs = (("nvl5_row", row),) if row else ()
    return HealthEvent(id="e1", node="n1", kind=EventKind.XID, time=datetime(2026, 11, 24, tzinfo=UTC),
                       code=code, severity=severity, attrs=attrs)


def test_a_non_fatal_row_is_judged_below_the_codes_floor() -> None:
    floor = judge(CAT, "xid", 149)
    row = judge(CAT, "xid", 149, subcode=BER)
    assert floor.severity is Severity.DEGRADED  # an undecoded 149 is still looked at
    assert (row.severity, row.action, row.basis) == (Severity.INFO, Action.NONE, "catalog")
    assert row.name == floor.name  # the Xid's mnemonic, not the row's


def test_a_fatal_row_is_fatal_and_resets_the_gpu() -> None:
    j = judge(CAT, "xid", 149, subcode=PEER_DOWN)
    assert (j.severity, j.action) == (Severity.FATAL, Action.RESET_GPU)


def test_a_row_name_the_sheet_lacks_falls_back_to_the_floor() -> None:
    for row in ("NETIR_BER_EVENT:0x000000ff:000000", "garbage"):
        assert judge(CAT, "xid", 149, subcode=row).severity is Severity.DEGRADED
    assert judge(CAT, "xid", 79, subcode=BER).severity is judge(CAT, "xid", 79).severity  # not 79's row


def test_a_stated_severity_still_raises_a_row_but_never_lowers_one() -> None:
    assert judge(CAT, "xid", 149, subcode=BER, stated=Severity.FATAL).severity is Severity.FATAL
    assert judge(CAT, "xid", 149, subcode=PEER_DOWN, stated=Severity.INFO).severity is Severity.FATAL
    assert judge(CAT, "xid", 149, stated=Severity.INFO).severity is Severity.DEGRADED  # a word alone: floor


def test_a_site_override_of_the_code_wins_over_every_row() -> None:
    site = CAT.with_overrides({"override": [{"kind": "xid", "code": 149, "severity": "fatal",
                                             "action": "drain_and_inspect"}]})
    for row in (BER, PEER_DOWN, ""):
        j = judge(site, "xid", 149, subcode=row)
        assert (j.severity, j.action, j.basis) == (Severity.FATAL, Action.DRAIN_AND_INSPECT, "site override")


def test_the_agents_event_carries_the_row_and_the_controller_judges_by_it() -> None:
    dec = Decoder(None, boot_time=datetime(2026, 11, 24, tzinfo=UTC))  # the agent: no catalog
    (finding,) = dec.feed(BER_LINE) + dec.flush()
    event = finding_to_event(finding, "n1", id="b1:1")
    assert event is not None and event.attr("nvl5_row") == BER
    assert judge_event(CAT, event).severity is Severity.INFO
    assert judge_event(CAT, _event("")).severity is Severity.DEGRADED  # the same Xid from NVML


def test_admission_judges_two_rows_of_one_code_apart() -> None:
    adm = Admission(CAT, None, merge_window=timedelta(seconds=30), hold=timedelta(0))
    a, b, c = adm.prepare([_event(BER), _event(PEER_DOWN), _event("")])
    assert [e.judgement.severity for e in (a, b, c) if e.judgement] == [Severity.INFO, Severity.FATAL,
                                                                          Severity.DEGRADED]


def test_the_node_status_file_keeps_the_row_for_the_health_check() -> None:
    obs = (Observation("xid", 149, "n1-gpu0", subcode=BER),)
    status = NodeStatus("n1", datetime(2026, 11, 24, tzinfo=UTC), "ok", observations=obs)
    back = parse_status(json.dumps(status.to_json()))
    assert back.observations == obs
    assert verdict(back, CAT)[0] == "ok"  # info counts for nothing
    undecoded = NodeStatus("n1", status.time, "ok", observations=(Observation("xid", 149, "n1-gpu0"),))
    assert verdict(undecoded, CAT)[0] == "degraded"
