"""Replay a recorded kernel log (``gpufleet agent --kmsg-file PATH``) instead of following ``/dev/kmsg``.

A site tests its policy on a real log: the file is read from its start through the same decoder the live
follower uses (:class:`~gpufleet.agent.collectors.kmsg.LogDecoder`, the diagnose decoder in production),
then followed like ``tail -f`` (lines appended later are read by later polls; a last line without its
newline waits for it).

Every line's prefix goes through the diagnose :class:`~gpufleet.diagnose.prefix.PrefixParser`, so any
form ``gpufleet diagnose`` reads works: plain dmesg, ``dmesg -T``/``-H``/iso, journalctl short and iso,
syslog, ``/dev/kmsg`` records. An event's time is its line's own time; seconds since boot are placed
after the boot time of this machine (``btime`` in ``<proc_root>/stat``); a line with no time gets the
clock's now. Lines without a year (journal short form) take the file's modification year.

Ids are deterministic, so a re-run of the same file resends the same ids and the controller drops them:
``<node>:file:<sha1 of the file's first 4 KiB>[:16]:<line where the event starts>:<n>``. A file shorter
than 4 KiB at the start (a log being written, followed from empty) is hashed as it is then, and with
``state_path`` the key and the bytes it covers are kept: a later run on the same file (path and inode),
no shorter than before and still beginning with those bytes (the same log, grown) keeps the key, and so
its ids. Without it, such a file's key changed as it
grew and a restarted agent sent every line again under new ids. A replay always starts from the top
(:meth:`commit` does nothing).
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from gpufleet.agent.clock import AgentClock
from gpufleet.agent.collectors.kmsg import (
    Decode,
    LineDecoder,
    LogDecoder,
    boot_time,
    feed_guarded,
    flush_guarded,
    identify,
)
from gpufleet.diagnose.prefix import PrefixParser
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import HealthEvent
from gpufleet.files import write_atomic

log = logging.getLogger(__name__)

SOURCE = "kmsg-file"
_HEAD = 4096  # bytes hashed into the ids
_READ = 1 << 20
_MAX_LINE = 1 << 16  # a longer "line" is cut here (the rest up to its newline is dropped)


class KmsgFileReplay:
    """The :class:`~gpufleet.agent.collectors.kmsg.KernelLog` surface over a recorded log file."""

    def __init__(
        self,
        node: str,
        decode: Decode | LogDecoder,
        path: Path,
        *,
        clock: AgentClock,
        proc_root: Path = Path("/proc"),
        year: int | None = None,
        state_path: Path | None = None,
    ) -> None:
        self.node = node
        self.decoder: LogDecoder = decode if isinstance(decode, LogDecoder) else LineDecoder(decode)
        self.path = path
        self.clock = clock
        self.proc_root = proc_root
        self.year = year
        self.source = SOURCE
        self.state_path = state_path  # the id key of this file and the bytes it covers, kept across runs
        self.lines = 0
        self.key = ""
        self._fh: BinaryIO | None = None
        self._buf = b""
        self._prefix = PrefixParser()

    def start(self) -> str:
        """Open the file; raises InvalidInput naming ``--kmsg-file`` when it cannot be read."""
        try:
            fh = self.path.open("rb")
            mtime = self.path.stat().st_mtime
        except OSError as err:
            raise InvalidInput("--kmsg-file", str(self.path), f"a readable kernel log file ({err.strerror})") from None
        self._fh = fh
        self.key = self._key(fh.read(_HEAD))
        fh.seek(0)
        year = self.year or datetime.fromtimestamp(mtime, UTC).year
        self._prefix = PrefixParser(year=year, boot_time=boot_time(self.proc_root))
        self.lines, self._buf = 0, b""
        log.info("%s: replaying %s (id key %s)", self.node, self.path, self.key)
        return SOURCE

    def _key(self, head: bytes) -> str:
        """The ids' key: the one kept for this file if it is the same file, grown (same path and inode, no
        shorter than at the last run, still beginning with the bytes that key covers)."""
        key, covered = hashlib.sha1(head).hexdigest()[:16], len(head)
        if self.state_path is None:
            return key
        where = str(self.path.resolve())
        st = self.path.stat()
        try:
            kept = json.loads(self.state_path.read_text(encoding="utf-8"))
            n, old = int(kept["bytes"]), str(kept["key"])
            if (kept["path"], kept["inode"]) == (where, st.st_ino) and st.st_size >= int(kept["size"]) \
                    and len(head) >= n and hashlib.sha1(head[:n]).hexdigest()[:16] == old:
                key, covered = old, n  # the same log, grown since
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none kept yet, or unreadable: this run's key
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.state_path, json.dumps({"path": where, "inode": st.st_ino, "size": st.st_size,
                                                      "bytes": covered, "key": key}) + "\n")
        except OSError as err:
            log.warning("%s: cannot keep the replay's id key in %s (%s): a restart may resend lines under new ids",
                        self.node, self.state_path, err)
        return key

    def poll(self) -> list[HealthEvent]:
        """Decode every complete line not read yet (to the end of the file as it is now)."""
        fh = self._fh
        if fh is None:
            return []
        found: list[tuple[int, HealthEvent]] = []
        read_any = False
        while chunk := fh.read(_READ):
            read_any = True
            data = self._buf + chunk
            *lines, rest = data.split(b"\n")
            self._buf = rest if len(rest) <= _MAX_LINE else rest[:_MAX_LINE]
            for raw in lines:
                found += self._line(raw)
        if read_any:  # the end of a burst completes an open multi-line event, as the live follower does
            found += flush_guarded(self.decoder)
        return identify(self.node, SOURCE, found, lambda line: f"{self.node}:file:{self.key}:{line}")

    def commit(self) -> None:
        """Nothing to keep: a replay restarts from the top and its ids repeat."""

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _line(self, raw: bytes) -> list[tuple[int, HealthEvent]]:
        self.lines += 1
        text = raw[:_MAX_LINE].decode("utf-8", "replace").rstrip("\r")
        if not text.strip():
            return []
        parsed = self._prefix.parse(text)
        when = parsed.time or self.clock.now()
        return feed_guarded(self.decoder, parsed.message, self.lines, when)
