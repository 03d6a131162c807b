"""``/dev/kmsg`` records: ``PRI,SEQ,USEC,FLAGS[,...];MESSAGE`` (Documentation/ABI/testing/dev-kmsg).

A record's continuation lines (`` KEY=VALUE`` device properties) start with a space and carry no
message; :func:`parse_kmsg_record` returns None for them and for anything else that is not a record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RECORD = re.compile(r"^(\d{1,10}),(\d{1,20}),(\d{1,20}),([^;,]*)[^;]*;(.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    priority: int  # syslog level 0 (emerg) .. 7 (debug)
    facility: int  # 0 = kernel
    seq: int
    usec: int  # monotonic microseconds since boot
    flags: str  # "-" or "c" (continuation of a previous fragment)
    message: str

    @property
    def uptime(self) -> float:
        """Seconds since boot."""
        return self.usec / 1_000_000


def parse_kmsg_record(line: str | bytes) -> KmsgRecord | None:
    """Parse one ``/dev/kmsg`` record, or return None when ``line`` is not one.

    Bytes are decoded as UTF-8 with invalid sequences replaced (the kernel escapes non-printable
    bytes as ``\\xNN`` already). The message keeps its text; the trailing newline is dropped.
    """
    text = line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line
    m = _RECORD.match(text.rstrip("\r\n"))
    if m is None:
        return None
    prefix = int(m[1])
    return KmsgRecord(
        priority=prefix & 7,
        facility=prefix >> 3,
        seq=int(m[2]),
        usec=int(m[3]),
        flags=m[4],
        message=m[5],
    )
