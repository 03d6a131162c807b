"""Garbage never crashes the decoder: it is counted instead."""

from __future__ import annotations

import gzip
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.diagnose import reader
from gpufleet.diagnose.decoder import MAX_LINE, Decoder
from gpufleet.diagnose.reader import decode_stream, open_log
from gpufleet.domain.catalog import Catalog, load_default_catalog

CATALOG: Catalog = load_default_catalog()
XID = b"[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"

# Bytes biased towards the tokens the recognisers look for, so that the fuzzing reaches them.
TOKENS = st.sampled_from(
    [
        b"NVRM: Xid (PCI:",
        b"0000:3b:00",
        b"): ",
        b"79",
        b", ",
        b"SXid",
        b"nvidia-nvswitch0: ",
        b"AER: ",
        b"PCIe Bus Error: severity=",
        b"Uncorrected (Fatal)",
        b"error status/mask=",
        b"[ 5] ",
        b"mlx5_core ",
        b"Port: 1 Link DOWN",
        b"EDAC MC0: 1 UE ",
        b"Killed process 1 (",
        b"\n",
        b"\x00",
        b"\xff\xfe",
        b"[",
        b"]",
        b"NVRM: The NVIDIA GPU ",
        b"fallen off the bus",
        b"4,1,2,-;",
        b"\r\n",
        b" " * 20,
    ]
)
BLOBS = st.one_of(st.binary(max_size=2000), st.lists(TOKENS, max_size=80).map(b"".join))


@settings(max_examples=300, deadline=None)
@given(BLOBS)
def test_feed_never_raises(data: bytes) -> None:
    dec = Decoder(CATALOG, year=2026)
    for line in data.split(b"\n"):
        dec.feed(line)
        dec.feed(line.decode("utf-8", errors="surrogateescape"))
    dec.flush()
    assert dec.stats.lines == 2 * len(data.split(b"\n"))


@settings(max_examples=200, deadline=None)
@given(BLOBS)
def test_stream_never_raises_and_counts_every_line(data: bytes) -> None:
    dec = Decoder(CATALOG, year=2026)
    list(decode_stream(io.BytesIO(data), dec))
    assert dec.stats.lines == data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def test_binary_and_invalid_utf8_lines_are_counted_and_findings_survive() -> None:
    data = b"\x00\x01\x02 garbage\n" + b"caf\xe9 latin-1\n" + XID + b"\xff\xff\xff\n"
    dec = Decoder(CATALOG)
    found = list(decode_stream(io.BytesIO(data), dec))
    assert [f.code for f in found] == [79]
    assert (dec.stats.lines, dec.stats.binary, dec.stats.invalid_utf8) == (4, 1, 2)


def test_invalid_utf8_inside_a_candidate_line_is_replaced() -> None:
    dec = Decoder(CATALOG)
    found = (
        dec.feed(b"[ 1.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=\xff\xfe, Graphics Exception")
        + dec.flush()
    )
    assert [f.code for f in found] == [13]
    assert dec.stats.invalid_utf8 == 1 and "\ufffd" in found[0].raw


def test_line_cut_off_at_end_of_input_is_still_decoded() -> None:
    dec = Decoder(CATALOG)
    found = list(decode_stream(io.BytesIO(b"benign\n" + XID.rstrip(b"\n")), dec))
    assert [(f.code, f.line) for f in found] == [(79, 2)]
    assert dec.stats.truncated == 1


def test_truncated_xid_line_gives_no_finding_and_no_error() -> None:
    dec = Decoder(CATALOG)
    assert dec.feed("[ 1.0] NVRM: Xid (PCI:0000:3b:0") + dec.flush() == []


def test_overlong_line_is_cut_and_later_lines_keep_their_numbers() -> None:
    data = b"x" * (2 * reader._MAX_PENDING) + b"\n" + XID
    dec = Decoder(CATALOG)
    found = list(decode_stream(io.BytesIO(data), dec))
    assert [(f.code, f.line) for f in found] == [(79, 2)]
    assert dec.stats.truncated >= 1
    assert MAX_LINE < reader._MAX_PENDING


def test_corrupt_gzip_keeps_what_was_decoded() -> None:
    blob = gzip.compress(XID * 50)
    stream = open_log("-", io.BytesIO(blob[: len(blob) - 12]))
    dec = Decoder(CATALOG)
    found = list(decode_stream(stream, dec))
    assert found and all(f.code == 79 for f in found)


def test_repeated_findings_beyond_the_cap_are_counted_not_kept() -> None:
    from gpufleet.diagnose.report import KEEP_PER_KEY, analyse

    line = b"[ 1.0] nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate\n"
    dec = Decoder(CATALOG)
    rep = analyse(decode_stream(io.BytesIO(line * (KEEP_PER_KEY + 5)), dec), CATALOG, dec.stats)
    assert (len(rep.findings), rep.suppressed, dec.stats.findings) == (KEEP_PER_KEY, 5, KEEP_PER_KEY + 5)


def test_flush_completes_an_event_waiting_for_continuation_lines() -> None:
    dec = Decoder(CATALOG)
    assert dec.feed(XID) == [] and dec.has_open_event  # an Xid may still be followed by dump lines
    assert [f.code for f in dec.flush()] == [79] and not dec.has_open_event


def test_xid_and_sxid_lines_no_rule_can_read_are_counted_and_said() -> None:
    from gpufleet.diagnose.report import analyse, render_table

    dec = Decoder(CATALOG)
    log = (b"[ 1.0] NVRM: Xid (PCI:0000:3b:00): abc, pid=1\n"
           b"[ 2.0] NVRM: Xid 48\n"
           b"[ 3.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): garbage\n"
           + XID +
           b"[ 5.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    found = list(decode_stream(io.BytesIO(log), dec))
    assert [f.code for f in found] == [79]
    assert dec.stats.undecoded == 3 and dec.stats.to_dict()["undecoded"] == 3
    report = analyse(found, CATALOG, dec.stats)
    assert "input: 3 Xid/SXid lines not understood" in render_table(report, "log")
