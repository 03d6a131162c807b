from __future__ import annotations

from gpufleet.diagnose.kmsg import parse_kmsg_record


def test_record_fields() -> None:
    rec = parse_kmsg_record(
        b"30,1022,4254197860,-;NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.\n"
    )
    assert rec is not None
    assert (rec.priority, rec.facility, rec.seq, rec.usec, rec.flags) == (6, 3, 1022, 4254197860, "-")
    assert rec.message.startswith("NVRM: Xid") and rec.uptime == 4254.19786


def test_extra_header_fields_and_semicolons_in_message() -> None:
    rec = parse_kmsg_record("4,7,100,c,caller=T1;a; b; c")
    assert rec is not None and rec.flags == "c" and rec.message == "a; b; c"


def test_continuation_and_garbage_are_not_records() -> None:
    assert parse_kmsg_record(" SUBSYSTEM=pci") is None
    assert parse_kmsg_record(" DEVICE=+pci:0000:5d:00.0") is None
    assert parse_kmsg_record("[ 1.0] not kmsg") is None
    assert parse_kmsg_record(b"\xff\xfe;;;") is None
