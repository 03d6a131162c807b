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


def test_multi_line_printk_arrives_as_one_escaped_kmsg_record() -> None:
    # /dev/kmsg escapes the embedded newlines of one printk as \x0a; the NVSentinel #155 notice:
    from gpufleet.diagnose.decoder import Decoder
    from gpufleet.domain.catalog import load_default_catalog

    record = (
        "3,2001,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this "
        "system has\\x0aNVRM: fallen off the bus and is not responding to commands."
    )
    dec = Decoder(load_default_catalog())
    found = dec.feed(record) + dec.flush()
    assert [(f.kind.value, f.pci, f.get("pci_id")) for f in found] == [("gpu_lost", "0000:b3:00.0", "10de:26b5")]
