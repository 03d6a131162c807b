"""Timestamp and prefix forms of dmesg, journalctl, syslog and /dev/kmsg."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpufleet.diagnose.prefix import PrefixParser

XID = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."


def test_plain_dmesg_gives_uptime_and_no_time() -> None:
    p = PrefixParser(year=2026).parse(f"[ 4254.197860] {XID}")
    assert (p.message, p.time, p.uptime) == (XID, None, 4254.19786)


def test_boot_time_turns_uptime_into_wall_clock() -> None:
    boot = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    p = PrefixParser(boot_time=boot).parse(f"[   60.500000] {XID}")
    assert p.time == boot + timedelta(seconds=60.5)


def test_caller_id_stamp_is_stripped() -> None:
    assert PrefixParser().parse(f"[   36.764462][  T291] {XID}").message == XID


def test_ctime() -> None:
    p = PrefixParser().parse(f"[Fri Aug 30 11:43:09 2024] {XID}")
    assert p.time == datetime(2024, 8, 30, 11, 43, 9, tzinfo=UTC)
    assert p.message == XID


def test_human_relative_stamps_accumulate() -> None:
    pp = PrefixParser(year=2026)
    first = pp.parse("[Nov21 12:00] usb 1-1: new device")
    pp.relative_delta("[  +0.500000] benign line the decoder skipped")
    third = pp.parse(f"[  +1.250000] {XID}")
    assert first.time == datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
    assert third.time == datetime(2026, 11, 21, 12, 0, 1, 750000, tzinfo=UTC)
    assert third.message == XID and pp.relative_mode


def test_dmesg_iso_has_no_host_tag() -> None:
    p = PrefixParser().parse("2024-04-29T14:55:41,679700+02:00 Out of memory: Killed process 1 (x)")
    assert p.message == "Out of memory: Killed process 1 (x)"
    assert p.time == datetime(2024, 4, 29, 14, 55, 41, 679700, tzinfo=timezone(timedelta(hours=2)))


def test_short_iso_with_host_and_tag() -> None:
    p = PrefixParser().parse(f"2026-11-21T12:00:03+0000 gpu-node-7 kernel: {XID}")
    assert p.message == XID
    assert p.time == datetime(2026, 11, 21, 12, 0, 3, tzinfo=UTC)


@pytest.mark.parametrize(
    ("line", "month"),
    [
        (f"Feb 14 05:03:41 host-1 kernel: {XID}", 2),
        (f"фев 12 00:48:02 kernel: {XID}", 2),
        (f"jan. 29 20:50:17 kevin kernel: {XID}", 1),
        (f"Dez 24 10:00:00 rechner kernel: {XID}", 12),
        (f"11月 21 12:00:03 node kernel: {XID}", 11),
        (f"May 15 23:09:30 ubuntu kernel: [  518.050606] {XID}", 5),
    ],
)
def test_journal_short_in_several_locales(line: str, month: int) -> None:
    p = PrefixParser(year=2026).parse(line)
    assert p.message == XID
    assert p.time is not None and p.time.month == month


def test_unknown_month_name_keeps_the_message() -> None:
    p = PrefixParser(year=2026).parse(f"Xyz 14 05:03:41 host kernel: {XID}")
    assert p.message == XID and p.time is None


def test_year_rolls_over_in_a_log_without_years() -> None:
    pp = PrefixParser(year=2025)
    pp.parse(f"Dec 31 23:59:59 h kernel: {XID}")
    p = pp.parse(f"Jan  1 00:00:01 h kernel: {XID}")
    assert p.time == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)


def test_syslog_without_hostname_keeps_subsystem_tag_in_message() -> None:
    p = PrefixParser(year=2018).parse(
        "Feb 23 03:28:16 kernel: mce: [Hardware Error]: Machine check events logged"
    )
    assert p.message == "mce: [Hardware Error]: Machine check events logged"


def test_kmsg_record() -> None:
    p = PrefixParser().parse(f"3,1022,4254197860,-;{XID}")
    assert (p.message, p.uptime) == (XID, 4254.19786)


def test_syslog_priority_prefix() -> None:
    assert PrefixParser().parse(f"<3>[ 12.000000] {XID}").message == XID


def test_dmesg_human_log_times_through_both_readers() -> None:
    import io

    from gpufleet.diagnose.decoder import Decoder
    from gpufleet.diagnose.reader import decode_stream
    from gpufleet.domain.catalog import load_default_catalog

    log = (
        "[Nov21 12:00] usb 1-1: new high-speed USB device number 2 using xhci_hcd\n"
        "[  +2.000000] EXT4-fs (sda1): mounted filesystem\n"
        "[  +0.500000] systemd[1]: Started Session 1 of user root.\n"
        f"[  +1.000000] {XID}\n"
    )
    want = datetime(2026, 11, 21, 12, 0, 3, 500000, tzinfo=UTC)
    cat = load_default_catalog()
    dec = Decoder(cat, year=2026)
    per_line = [f for ln in log.splitlines() for f in dec.feed(ln)] + dec.flush()
    dec2 = Decoder(cat, year=2026)
    streamed = list(decode_stream(io.BytesIO(log.encode()), dec2))
    assert [f.time for f in per_line] == [want] == [f.time for f in streamed]


def test_logread_prefix() -> None:
    # Line shape from https://github.com/Ysurac/openmptcprouter/issues/3879 (OpenWrt logread).
    p = PrefixParser().parse(f"Tue Apr  8 16:00:53 2025 kern.info kernel: [   16.570126] {XID}")
    assert p.message == XID and p.uptime == 16.570126
    assert p.time == datetime(2025, 4, 8, 16, 0, 53, tzinfo=UTC)
