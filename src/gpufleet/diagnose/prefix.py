"""Strip a kernel-log line's prefix (timestamp, host, tag) and read its time.

Forms understood, each with an example:

* dmesg:               ``[ 4254.197860] NVRM: ...`` (seconds since boot; caller id ``[  T291]`` allowed)
* dmesg -T / --ctime:  ``[Fri Aug 30 11:43:09 2024] NVRM: ...``
* dmesg -H (relative): ``[Nov21 12:00] ...`` then ``[  +0.000123] ...`` (delta to the previous line)
* dmesg --time-format iso: ``2024-04-29T14:55:41,678628+02:00 ...``
* journalctl -k (short): ``Feb 14 05:03:41 host kernel: ...`` (month names of any locale, e.g.
  ``фев 12``, ``11月 21``; an unknown month name keeps the message and drops the time)
* journalctl -o short-iso / rsyslog: ``2026-11-21T12:00:03+0000 host kernel: ...``
* ``/dev/kmsg`` records: ``4,1234,5678901,-;NVRM: ...``
* fabricmanager.log: ``[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch ...``
* logread (busybox/OpenWrt): ``Tue Apr  8 16:00:53 2025 kern.info kernel: [ 16.57] ...``
* an optional ``<4>`` syslog priority, and a ``[ secs]`` dmesg stamp after a syslog tag.

Lines without a recognised prefix are passed through unchanged (bug-report sections, plain text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from gpufleet.diagnose.kmsg import parse_kmsg_record

# Month names and abbreviations seen in syslog/journal output of common locales, lower-cased and
# without a trailing dot.
_MONTHS: dict[str, int] = {}
for _i, _names in enumerate(
    [
        "jan january janv janvier jän jänner januar ene enero gen gennaio janeiro jaan янв январь sty",
        "feb february févr février februar febr febrero febbraio fev fevereiro фев февраль lut",
        "mar march mars märz mär maerz marzo março мар март",
        "apr april avr avril abr abril aprile апр апрель kwi",
        "may mai mei mayo maggio maio май maj",
        "jun june juin juni junio giu giugno junho июн июнь cze",
        "jul july juil juillet juli julio lug luglio julho июл июль lip",
        "aug august août aout ago agosto авг август sie",
        "sep sept september septembre septiembre set settembre setembro сен сентябрь wrz",
        "oct october okt oktober octobre octubre ott ottobre out outubro окт октябрь paź",
        "nov november novembre noviembre novembro ноя ноябрь lis",
        "dec december déc décembre dez dezember dic diciembre dicembre dezembro дек декабрь gru",
    ],
    start=1,
):
    for _n in _names.split():
        _MONTHS[_n] = _i

_KMSG_HEAD = re.compile(r"^\d{1,10},\d{1,20},\d{1,20},")
_PRIO = re.compile(r"^<\d{1,3}>")
_DMESG = re.compile(r"^\[\s*(\d{1,12}\.\d{1,9})\](?:\[\s*[TC]\d+\])?\s?")
_DMESG_REL = re.compile(r"^\[\s*\+(\d{1,12}\.\d{1,9})\]\s?")
_DMESG_HUMAN = re.compile(r"^\[(\w{3})\s?(\d{1,2}) (\d{2}):(\d{2})(?::(\d{2}))?\]\s?")
_DMESG_CTIME = re.compile(r"^\[\w+ (\w+)\.? +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\]\s?")
# fabricmanager.log: "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch ..."
_FABRIC = re.compile(r"^\[(\w{3}) (\d{1,2}) (\d{4}) (\d{2}):(\d{2}):(\d{2})\] \[\w+\] (?:\[tid \d+\] )?")
_ISO = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:([.,])(\d{1,9}))?"
    r"(Z|[+-]\d{2}:?\d{2})?\s+"
)
_CTIME_PLAIN = re.compile(r"^\w+ (\w+)\.? +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\s+")
_SYSLOG = re.compile(r"^(\w{1,12}\.?|\d{1,2}[月월])\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?\s+")
_HOST_TAG = re.compile(r"^(?:[^\s:]\S*[^\s:]|[^\s:])\s+([^\s:\[]+)(?:\[\d+\])?:\s")
_TAG = re.compile(r"^([^\s:\[]+)(?:\[\d+\])?:\s")


@dataclass(frozen=True, slots=True)
class Parsed:
    message: str
    time: datetime | None
    uptime: float | None
    host: str | None = None  # the host a syslog/journal prefix names (``... jambi kernel: ...``)


class PrefixParser:
    """Stateful because ``dmesg -H`` times are deltas and short journal lines carry no year.

    ``year`` is the year assumed for prefixes without one (the CLI passes the file's modification
    year); ``tz`` the zone of prefixes without an offset; ``boot_time`` turns seconds-since-boot into
    wall-clock time when given.
    """

    def __init__(
        self, *, year: int | None = None, tz: tzinfo = UTC, boot_time: datetime | None = None
    ) -> None:
        self.year = year
        self.tz = tz
        self.boot_time = boot_time
        self._last_month = 0
        self._rel_time: datetime | None = None  # running time of a dmesg -H log
        self.relative_mode = False  # True once a dmesg -H header was seen: every line matters

    def parse(self, line: str) -> Parsed:
        text = line.strip()
        time: datetime | None = None
        uptime: float | None = None
        if _KMSG_HEAD.match(text):
            rec = parse_kmsg_record(text)
            if rec is not None:
                return self._with_uptime(rec.message.strip(), rec.uptime)
        m = _PRIO.match(text)
        if m:
            text = text[m.end() :]
        if text.startswith("["):
            return self._bracketed(text)
        host: str | None = None
        m = _ISO.match(text)
        if m:
            time = self._iso(m)
            text = text[m.end() :]
            if m[7] != ",":  # dmesg --time-format iso (comma fraction) has no host/tag
                text, host = _strip_tag(text)
        elif (m := _SYSLOG.match(text)) is not None:
            time = self._short(m)
            text, host = _strip_tag(text[m.end() :])
        elif (m := _CTIME_PLAIN.match(text)) is not None:  # busybox/OpenWrt logread
            month = _MONTHS.get(m[1].lower())
            if month:
                time = _mk(int(m[6]), month, int(m[2]), int(m[3]), int(m[4]), int(m[5]), self.tz)
            text, host = _strip_tag(text[m.end() :])
        if text.startswith("["):
            inner = self._bracketed(text)
            return Parsed(inner.message, time or inner.time, inner.uptime, host)
        return Parsed(text, time, uptime, host)

    def relative_delta(self, line: str) -> None:
        """Advance the running ``dmesg -H`` clock over a line that is otherwise skipped."""
        text = line.lstrip()
        if text.startswith("["):
            self._bracketed(text)

    # -- helpers ---------------------------------------------------------------------------------

    def _with_uptime(self, message: str, uptime: float) -> Parsed:
        time = self.boot_time + timedelta(seconds=uptime) if self.boot_time else None
        return Parsed(message, time, uptime)

    def _bracketed(self, text: str) -> Parsed:
        m = _DMESG.match(text)
        if m:
            return self._with_uptime(text[m.end() :], float(m[1]))
        m = _DMESG_REL.match(text)
        if m:
            if self._rel_time is not None:
                self._rel_time += timedelta(seconds=float(m[1]))
            return Parsed(text[m.end() :], self._rel_time, None)
        m = _DMESG_CTIME.match(text)
        if m:
            month = _MONTHS.get(m[1].lower())
            t = None
            if month:
                t = _mk(int(m[6]), month, int(m[2]), int(m[3]), int(m[4]), int(m[5]), self.tz)
            return Parsed(text[m.end() :], t, None)
        m = _FABRIC.match(text)
        if m:
            month = _MONTHS.get(m[1].lower())
            t = _mk(int(m[3]), month, int(m[2]), int(m[4]), int(m[5]), int(m[6]), self.tz) if month else None
            return Parsed(text[m.end() :], t, None)
        m = _DMESG_HUMAN.match(text)
        if m:
            month = _MONTHS.get(m[1].lower())
            t = None
            if month and self.year:
                t = _mk(self.year, month, int(m[2]), int(m[3]), int(m[4]), int(m[5] or 0), self.tz)
            self._rel_time = t
            self.relative_mode = True
            return Parsed(text[m.end() :], t, None)
        return Parsed(text, None, None)

    def _iso(self, m: re.Match[str]) -> datetime | None:
        tz: tzinfo = self.tz
        off = m[9]
        if off:
            if off == "Z":
                tz = UTC
            else:
                digits = off[1:].replace(":", "")
                delta = timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
                tz = _fixed(-delta if off[0] == "-" else delta)
        micro = int((m[8] or "0")[:6].ljust(6, "0"))
        t = _mk(int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]), tz)
        return t.replace(microsecond=micro) if t else None

    def _short(self, m: re.Match[str]) -> datetime | None:
        token = m[1].lower().rstrip(".")
        month = _MONTHS.get(token)
        if month is None and token[:-1].isdigit():
            month = int(token[:-1])  # 11月 / 11월
        if not month or not 1 <= month <= 12 or self.year is None:
            return None
        if self._last_month and month < self._last_month - 6:
            self.year += 1  # December -> January in a log without years
        self._last_month = month
        return _mk(self.year, month, int(m[2]), int(m[3]), int(m[4]), int(m[5]), self.tz)


def _strip_tag(text: str) -> tuple[str, str | None]:
    """The message after ``host tag[pid]: `` (or ``tag: ``), and the host when the prefix names one."""
    m = _HOST_TAG.match(text)
    if m:
        return text[m.end() :], text.split(None, 1)[0]
    m = _TAG.match(text)
    return (text[m.end() :], None) if m else (text, None)


def _fixed(delta: timedelta) -> tzinfo:
    from datetime import timezone

    return timezone(delta)


def _mk(year: int, month: int, day: int, hh: int, mm: int, ss: int, tz: tzinfo) -> datetime | None:
    try:
        return datetime(year, month, day, hh, mm, ss, tzinfo=tz)
    except ValueError:
        return None
