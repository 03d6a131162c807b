"""Kernel-log follower: ``/dev/kmsg`` (non-blocking), falling back to ``journalctl -k -f -o json``.

Every kernel message goes through an injected ``decode(message) -> Iterable[HealthEvent]`` (the diagnose
decoder in production). The follower then gives each event a *deterministic* id and the message's own
time, so that a restart re-reading the ring buffer produces the same ids and the controller drops the
copies:

* kmsg: ``<node>:kmsg:<boot_id>:<seq>:<n>`` (``seq`` is the kernel's record sequence number);
* journal: ``<node>:journal:<sha1(cursor)[:16]>:<n>``.

Resume: the position (boot id + last kmsg seq, or the journal cursor) is kept in ``state_path``.
:meth:`poll` returns new events and remembers the new position; :meth:`commit` writes it, and the runner
calls it only after the events are in the spool. A crash in between resends, never loses.

/dev/kmsg record format (Linux ``Documentation/ABI/testing/dev-kmsg``), parsed by
:func:`gpufleet.diagnose.kmsg.parse_kmsg_record` (the one parser; messages keep the kernel's ``\\xNN``
escapes, as ``gpufleet diagnose`` sees them)::

    <prio>,<seq>,<usec since boot>,<flags>[,...];<message>\n[ KEY=value\n]...

``kmsg_path`` may also name a regular file of such records: it is read the same way (everything, then
whatever is appended). That is the simulated kernel ring of ``--device sim`` (docs/agent.md).

Every event gets ``source`` = the source that read it (``kmsg`` or ``journal``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol, runtime_checkable

from gpufleet.agent.clock import AgentClock, SystemClock
from gpufleet.diagnose.kmsg import parse_kmsg_record
from gpufleet.domain.events import HealthEvent

log = logging.getLogger(__name__)

Decode = Callable[[str], Iterable[HealthEvent]]
Spawn = Callable[[list[str]], "subprocess.Popen[bytes]"]


@runtime_checkable
class LogDecoder(Protocol):
    """A stateful kernel-log decoder (multi-line events). ``feed`` gets one message with its sequence
    number (the kmsg seq, or a running line number for the journal) and the record's time; it returns
    the events completed so far as ``(start seq, event)``. ``flush`` completes an open multi-line event;
    the follower calls it at the end of every read burst (the kernel writes an event's lines together)."""

    def feed(self, message: str, seq: int, when: datetime) -> list[tuple[int, HealthEvent]]: ...

    def flush(self) -> list[tuple[int, HealthEvent]]: ...

    @property
    def undecoded(self) -> int:
        """Lines naming an Xid/SXid that the decoder could not read (no code, a bad one), so far."""
        ...


class KernelLog(Protocol):
    """What the runner needs of a kernel-log source: :class:`KmsgFollower` (the live log) or
    :class:`~gpufleet.agent.collectors.kmsgfile.KmsgFileReplay` (a recorded one)."""

    lines: int  # messages read so far
    decoder: LogDecoder

    def start(self) -> str:
        """Open the source; returns its name for the ``gpufleet_agent_kmsg_source`` metric."""
        ...

    def poll(self) -> list[HealthEvent]:
        """New events since the last poll (never blocks)."""
        ...

    def commit(self) -> None:
        """Persist the position of the last poll (called once its events are spooled)."""
        ...

    def close(self) -> None: ...


class LineDecoder:
    """Adapts a plain ``decode(message) -> events`` function (one message, no state) to :class:`LogDecoder`."""

    def __init__(self, decode: Decode) -> None:
        self.decode = decode

    def feed(self, message: str, seq: int, when: datetime) -> list[tuple[int, HealthEvent]]:
        return [(seq, replace(ev, time=when)) for ev in self.decode(message)]

    def flush(self) -> list[tuple[int, HealthEvent]]:
        return []

    @property
    def undecoded(self) -> int:
        return 0  # a plain function says nothing of what it could not read


_READ_SIZE = 8192
_RESPAWN_S = 30.0


def _default_spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


class KmsgFollower:
    def __init__(
        self,
        node: str,
        decode: Decode | LogDecoder,
        *,
        clock: AgentClock | None = None,
        kmsg_path: Path = Path("/dev/kmsg"),
        state_path: Path | None = None,
        proc_root: Path = Path("/proc"),
        journalctl: Sequence[str] = ("journalctl",),
        spawn: Spawn = _default_spawn,
    ) -> None:
        self.node = node
        self.decoder: LogDecoder = decode if isinstance(decode, LogDecoder) else LineDecoder(decode)
        self.clock: AgentClock = clock or SystemClock()
        self.kmsg_path = kmsg_path
        self.state_path = state_path
        self.proc_root = proc_root
        self.journalctl = list(journalctl)
        self.spawn = spawn
        self.source = "none"
        self.lines = 0
        self._fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._boot_id = ""
        self._boot_time = datetime(1970, 1, 1, tzinfo=UTC)
        self._seq = -1
        self._cursor = ""
        self._dirty = False
        self._next_spawn = 0.0
        self._jseq = 0

    # --- start / stop -----------------------------------------------------------------------
    def start(self) -> str:
        """Open ``/dev/kmsg``, else start journalctl; returns the source used ("kmsg", "journal", "none")."""
        self._boot_id = self._read_proc("sys/kernel/random/boot_id") or "unknown-boot"
        self._boot_time = boot_time(self.proc_root) or self.clock.now()
        saved = self._load_state()
        if saved.get("boot_id") == self._boot_id:
            seq = saved.get("kmsg_seq", -1)
            self._seq = seq if isinstance(seq, int) else -1
            self._cursor = str(saved.get("journal_cursor", ""))
        else:
            self._seq, self._cursor = -1, ""  # a new boot: the old position means nothing
        try:
            self._fd = os.open(self.kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
            self.source = "kmsg"
        except OSError as err:
            log.warning("cannot open %s (%s); falling back to journalctl -k -f", self.kmsg_path, err)
            self.source = "journal" if self._spawn_journal() else "none"
        return self.source

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None

    # --- reading ----------------------------------------------------------------------------
    def poll(self) -> list[HealthEvent]:
        """Read what is new (never blocks) and decode it."""
        if self.source == "kmsg":
            return self._poll_kmsg()
        if self.source in ("journal", "none") and self.journalctl and self._fd is None:
            return self._poll_journal()
        return []

    def commit(self) -> None:
        """Persist the position reached by the last :meth:`poll` (call after spooling its events)."""
        if not self._dirty or self.state_path is None:
            return
        state = {"boot_id": self._boot_id, "kmsg_seq": self._seq, "journal_cursor": self._cursor}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_path)
        self._dirty = False

    def _poll_kmsg(self) -> list[HealthEvent]:
        assert self._fd is not None
        chunks: list[bytes] = []
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                break
            except BrokenPipeError:
                log.warning("kernel ring buffer overran the reader: some kernel messages were lost")
                continue
            if not data:
                break
            chunks.append(data)
        if not chunks:
            return []
        self._buf += b"".join(chunks)
        *lines, self._buf = self._buf.split(b"\n")
        found: list[tuple[int, HealthEvent]] = []
        for raw in lines:
            rec = parse_kmsg_record(raw)
            if rec is None or rec.seq <= self._seq:
                continue
            self.lines += 1
            self._seq = rec.seq
            self._dirty = True
            when = self._boot_time + timedelta(microseconds=rec.usec)
            found += feed_guarded(self.decoder, rec.message, rec.seq, when)
        found += flush_guarded(self.decoder)
        return identify(self.node, self.source, found, lambda seq: f"{self.node}:kmsg:{self._boot_id}:{seq}")

    def _poll_journal(self) -> list[HealthEvent]:
        if self._proc is None and (self.clock.monotonic() < self._next_spawn or not self._spawn_journal()):
            return []
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        chunks: list[bytes] = []
        eof = False
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not data:
                eof = True
                break
            chunks.append(data)
        if eof:
            self._reap()  # read what it wrote first; restart it on a later poll
        if not chunks:
            return []
        self._buf += b"".join(chunks)
        *lines, self._buf = self._buf.split(b"\n")
        found: list[tuple[int, HealthEvent]] = []
        keys: dict[int, str] = {}
        for raw in lines:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            cursor = str(entry.get("__CURSOR", ""))
            msg = entry.get("MESSAGE", "")
            if isinstance(msg, list):  # journald sends non-UTF-8 messages as a byte array
                msg = bytes(int(b) & 0xFF for b in msg).decode("utf-8", "replace")
            try:
                when = datetime.fromtimestamp(int(entry["__REALTIME_TIMESTAMP"]) / 1e6, UTC)
            except (KeyError, ValueError, TypeError):
                when = self.clock.now()
            self.lines += 1
            if cursor:
                self._cursor = cursor
                self._dirty = True
            self._jseq += 1
            keys[self._jseq] = hashlib.sha1(cursor.encode()).hexdigest()[:16] if cursor else f"t{when.timestamp():.6f}"
            found += feed_guarded(self.decoder, str(msg), self._jseq, when)
        found += flush_guarded(self.decoder)
        return identify(self.node, self.source, found, lambda seq: f"{self.node}:journal:{keys.get(seq, seq)}")

    # --- helpers ----------------------------------------------------------------------------
    def _spawn_journal(self) -> bool:
        argv = [*self.journalctl, "-k", "-f", "-o", "json", "--no-pager"]
        argv += [f"--after-cursor={self._cursor}"] if self._cursor else ["--lines=all"]
        self._next_spawn = self.clock.monotonic() + _RESPAWN_S
        try:
            proc = self.spawn(argv)
        except OSError as err:
            log.error(
                "kernel log unavailable: cannot open %s nor run %s (%s); XIDs come from NVML only",
                self.kmsg_path,
                argv[0],
                err,
            )
            return False
        if proc.stdout is None:
            return False
        os.set_blocking(proc.stdout.fileno(), False)
        self._proc, self._buf = proc, b""
        self.source = "journal"
        return True

    def _reap(self) -> None:
        if self._proc is not None:
            code = self._proc.wait()
            log.warning("journalctl exited with %s; restarting it in %.0fs", code, _RESPAWN_S)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._proc = None

    def _read_proc(self, rel: str) -> str | None:
        try:
            return (self.proc_root / rel).read_text().strip()
        except OSError:
            return None

    def _load_state(self) -> dict[str, object]:
        if self.state_path is None:
            return {}
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}


# --- shared by every kernel-log source ---------------------------------------------------------
def boot_time(proc_root: Path) -> datetime | None:
    """The machine's boot time, or None when unreadable: ``btime`` in ``<proc_root>/stat``, to the
    microsecond when this process can tell it.

    ``btime`` is whole seconds (the kernel truncates), so kernel-log records placed after it land up to a
    second early: on a real H200 (2026-11-27) each XID's kernel-log line came 0.93 s *before* NVML
    delivered the same XID. This machine's wall clock less its time since boot (``CLOCK_BOOTTIME``) is
    the same instant, unrounded (the kernel computes ``btime`` from the same two clocks at each read, so a
    stepped wall clock moves both); it is used when it falls within that second of ``btime``, i.e. when
    ``proc_root`` is this machine's own ``/proc``, not a recorded, a test's or another host's one."""
    try:
        text = (proc_root / "stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("btime "):
            try:
                btime = int(line.split()[1])
            except (IndexError, ValueError):
                return None
            return datetime.fromtimestamp(_precise_boot(btime), UTC)
    return None


def _precise_boot(btime: int) -> float:
    """``btime`` refined to this machine's wall clock less ``CLOCK_BOOTTIME`` when that lies in
    ``[btime, btime + 1)`` (give or take the 10 ms the two clock reads and the kernel's own read of
    ``btime`` may be apart); else ``btime`` itself."""
    try:
        precise = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # no CLOCK_BOOTTIME (not Linux)
        return float(btime)
    return precise if btime - _READ_SKEW_S <= precise < btime + 1 + _READ_SKEW_S else float(btime)


_READ_SKEW_S = 0.01


def feed_guarded(decoder: LogDecoder, message: str, seq: int, when: datetime) -> list[tuple[int, HealthEvent]]:
    """``decoder.feed``; a decoder bug is logged and never stops the source."""
    try:
        return list(decoder.feed(message, seq, when))
    except Exception:
        log.exception("decoder failed on kernel message %r", message[:200])
        return []


def flush_guarded(decoder: LogDecoder) -> list[tuple[int, HealthEvent]]:
    try:
        return list(decoder.flush())
    except Exception:
        log.exception("decoder failed to flush")
        return []


def identify(
    node: str, source: str, found: list[tuple[int, HealthEvent]], base: Callable[[int], str]
) -> list[HealthEvent]:
    """Deterministic ids from the record where each event starts (``<base(seq)>:<n>``), this node, and
    the source that read it (``kmsg``, ``journal``, ``kmsg-file``)."""
    out: list[HealthEvent] = []
    per_seq: dict[int, int] = {}
    for seq, ev in found:
        n = per_seq.get(seq, 0)
        per_seq[seq] = n + 1
        out.append(replace(ev, id=f"{base(seq)}:{n}", node=node, source=source))
    return out
