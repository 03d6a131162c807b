"""The streaming kernel-log decoder.

    dec = Decoder(load_default_catalog())
    for n, line in enumerate(lines, 1):
        for finding in dec.feed(line, n):
            ...
    rest = dec.flush()

``feed`` takes ``str`` or ``bytes`` (undecodable bytes are replaced and counted, never raised), returns
the findings completed so far, and keeps at most one multi-line event open, so memory does not grow
with the log. Lines that do not contain one of :data:`rules.CANDIDATE_WORDS` are rejected by one
multi-word scan (:mod:`candidates`) before any parsing (see ``reader.decode_stream`` for the block-level version
of the same test that the CLI uses).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

from gpufleet.diagnose import candidates, rules, rules_host, rules_kernel
from gpufleet.diagnose.finding import Finding, FindingKind, normalise_pci
from gpufleet.diagnose.nvlink_remote import SwitchPorts
from gpufleet.diagnose.prefix import Parsed, PrefixParser
from gpufleet.domain.catalog import Action, Catalog
from gpufleet.domain.events import Severity
from gpufleet.domain.judgement import judge

log = logging.getLogger(__name__)

MAX_LINE = 16_384  # characters kept of one line; the rest is cut (and counted)
MAX_RAW = 4_096  # characters of joined raw text kept per finding
_NONFATAL = ("Non-fatal", "Nonfatal")
_HUMAN_HEADER = re.compile(rb"(?m)^\[[A-Z][a-z]{2}\s?\d{1,2} \d\d:\d\d\]")
_NAMES_XID = re.compile(r"\b(?:NVRM: Xid|SXid)\b")  # a line that says it reports an Xid/SXid
_CAP = 4_096  # entries kept in the decoder's small lookup tables (GPU UUIDs, link states)


@dataclass(slots=True)
class DecoderStats:
    """Counters over everything the decoder was given."""

    lines: int = 0
    bytes: int = 0
    candidates: int = 0  # lines that passed the cheap test and were parsed
    findings: int = 0
    binary: int = 0  # lines containing NUL bytes
    invalid_utf8: int = 0  # lines that were not valid UTF-8
    truncated: int = 0  # lines longer than MAX_LINE (cut), or cut off at end of input
    undecoded: int = 0  # lines naming an Xid or SXid that no rule could read (no code, a bad code)

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class _Open:
    pend: rules.Pending
    line: int
    time: datetime | None
    uptime: float | None
    raw: list[str]
    host: str | None = None  # the syslog host of the line that opened it


class Decoder:
    """Decode kernel-log lines into :class:`Finding` s, judged by ``catalog`` (None: not judged, as
    the agent decodes — only the controller judges what the agent observed).

    ``year`` is assumed for timestamps that carry none (journal short format, ``dmesg -H``);
    ``tz`` for timestamps without an offset; ``boot_time`` converts seconds-since-boot (plain dmesg,
    ``/dev/kmsg``) into wall-clock ``time``; ``switch_ports`` (``nvidia-smi nvlink -R`` read backwards,
    :mod:`nvlink_remote`) names the GPU on the far end of an SXid's switch port (``peer_gpu``,
    ``peer_nvlink``).
    """

    def __init__(
        self,
        catalog: Catalog | None,
        *,
        year: int | None = None,
        tz: tzinfo = UTC,
        boot_time: datetime | None = None,
        switch_ports: SwitchPorts | None = None,
    ) -> None:
        self.catalog = catalog
        self.switch_ports = switch_ports
        self.stats = DecoderStats()
        self._prefix = PrefixParser(year=year, tz=tz, boot_time=boot_time)
        self._open: _Open | None = None
        self._last_host: str | None = None
        self._next = 1
        self._oom_start: tuple[int, datetime | None, float | None] | None = None
        self._uuid: dict[str, str] = {}
        self._links: dict[str, str] = {}
        self._sxids: dict[tuple[str, int], _Open] = {}  # open SXid events, one per (switch, code)

    @property
    def wants_every_line(self) -> bool:
        """True while a multi-line event is open or the log uses dmesg -H relative stamps: then every
        line must go through :meth:`feed`, not only candidate lines."""
        return self._open is not None or self._prefix.relative_mode

    def prime(self, sample: bytes) -> None:
        """Look at the start of a log: a ``dmesg -H`` log needs every line (its stamps are deltas),
        so block readers must not skip lines in bulk. Call before feeding, with the first block."""
        if _HUMAN_HEADER.search(sample[:65536]):
            self._prefix.relative_mode = True

    def skip_clean(self, lines: int, nbytes: int) -> None:
        """Account for ``lines`` complete lines of ``nbytes`` bytes known to be ASCII without NULs."""
        self.stats.lines += lines
        self.stats.bytes += nbytes
        self._next += lines

    def skip(self, region: bytes, lines: int) -> None:
        """Account for ``lines`` complete lines (``region``) that the caller rejected in bulk."""
        st = self.stats
        st.lines += lines
        st.bytes += len(region)
        self._next += lines
        if b"\x00" in region:
            st.binary += sum(1 for ln in region.split(b"\n")[:lines] if b"\x00" in ln)
        if not region.isascii():
            for ln in region.split(b"\n")[:lines]:
                try:
                    ln.decode("utf-8")
                except UnicodeDecodeError:
                    st.invalid_utf8 += 1

    def feed(self, line: str | bytes, lineno: int | None = None) -> list[Finding]:
        """Decode one line; return the findings that are complete after it."""
        n = self._next if lineno is None else lineno
        self._next = n + 1
        st = self.stats
        st.lines += 1
        if isinstance(line, bytes):
            st.bytes += len(line)
            if b"\x00" in line:
                st.binary += 1
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError:
                st.invalid_utf8 += 1
                text = line.decode("utf-8", errors="replace")
        else:
            text = line
            st.bytes += len(text)
        text = text.rstrip("\r\n")
        if len(text) > MAX_LINE:
            st.truncated += 1
            text = text[:MAX_LINE]
        candidate = candidates.in_line(text)
        out: list[Finding] = []
        if candidate and "SXid" in text:
            key = rules.sxid_key(text)
            if key is not None:
                out += self._close()
                return out + self._feed_sxid(text, n, *key)
        if candidate and self._sxids:
            out += self._close_sxids()
        if self._open is not None:
            parsed = self._prefix.parse(text)
            op = self._open
            if op.pend.accept(parsed.message):
                op.pend.lines += 1
                if sum(len(r) for r in op.raw) < MAX_RAW:
                    op.raw.append(text)
                return out
            out += self._close()
            if not candidate:
                return out
            st.candidates += 1
            pend = self._recognise(parsed.message, n)
            if pend is None:
                self._undecoded(text)
        else:
            if not candidate:
                if self._prefix.relative_mode or (text[:1] == "[" and text[1:2].isalpha()):
                    self._prefix.relative_delta(text)  # dmesg -H: keep the running clock
                return out
            # Recognise on the raw line (the recognisers search, they do not anchor) and parse the
            # prefix only for a hit: most candidate lines are benign driver chatter.
            st.candidates += 1
            pend = self._recognise(text, n)
            if pend is None:
                self._undecoded(text)
            if pend is None or isinstance(pend, rules_host.LinkUp):  # no event: skip the prefix
                if self._prefix.relative_mode:
                    self._prefix.relative_delta(text)
                if pend is not None:
                    self._link_up(pend)
                return out
            parsed = self._prefix.parse(text)
        if pend is None:
            return out
        if isinstance(pend, rules_host.OomStart):
            self._oom_start = (n, parsed.time, parsed.uptime)
            return out
        if isinstance(pend, rules_host.LinkUp):
            self._link_up(pend)
            return out
        self._open = _Open(pend, n, parsed.time, parsed.uptime, [text], self._host_of(parsed))
        if type(pend) is rules.Pending:  # takes no further lines: complete now
            out += self._close()
        return out

    @property
    def has_open_event(self) -> bool:
        """True while a multi-line event waits for its next line (see :meth:`flush`)."""
        return self._open is not None or bool(self._sxids)

    def flush(self) -> list[Finding]:
        """Complete the open multi-line event, if any.

        Call at end of input — and, when following a live source such as ``/dev/kmsg``, whenever
        the source has been idle for a moment while :attr:`has_open_event` is true: an event is
        only complete when the next line shows it has no more continuation lines.
        """
        return self._close() + self._close_sxids()

    # -- internals -------------------------------------------------------------------------------

    def _undecoded(self, text: str) -> None:
        """Count a line that names an Xid/SXid none of the rules could read: a report must not pass
        over a fault line it did not understand as if there were nothing there."""
        if _NAMES_XID.search(text):
            self.stats.undecoded += 1

    def _feed_sxid(self, text: str, n: int, key: tuple[str, int], detail: bool) -> list[Finding]:
        """An NVSwitch SXid line: a detail line joins its own switch's open header, whatever other
        switches' lines came in between; any other line opens that switch's next event."""
        self.stats.candidates += 1
        op = self._sxids.get(key)
        if detail and op is not None and op.pend.accept(self._prefix.parse(text).message):
            op.pend.lines += 1
            if sum(len(r) for r in op.raw) < MAX_RAW:
                op.raw.append(text)
            return []
        out = self._close_sxids() if op is not None else []  # that switch's next event: emit in line order
        parsed = self._prefix.parse(text)
        pend = rules.sxid(parsed.message)
        if pend is not None and (key in self._sxids or len(self._sxids) < 64):
            self._sxids[key] = _Open(pend, n, parsed.time, parsed.uptime, [text], self._host_of(parsed))
        elif pend is not None:
            out += self._finish(_Open(pend, n, parsed.time, parsed.uptime, [text], self._host_of(parsed)))
        return out

    def _close_sxids(self) -> list[Finding]:
        ops = sorted(self._sxids.values(), key=lambda o: o.line)
        self._sxids.clear()
        return [f for op in ops for f in self._finish(op)]

    def _recognise(self, msg: str, n: int) -> rules.Pending | None:
        if "Xid" in msg:
            pend = rules.xid(msg)
            if pend is not None:
                return pend
        if "detected NVSwitch" in msg:
            return rules.sxid(msg)
        if "NVRM" in msg or "probe" in msg or "GPU is lost" in msg:
            if "NVRM: GPU at " in msg and "GPU-" in msg:
                self._remember_uuid(msg)
                return None
            pend = rules.gpu_lost(msg) or rules.nvlink(msg)
            if pend is not None:
                return pend
        if "AER" in msg or "PCIe Bus Error" in msg:
            pend = rules_host.aer(msg)
            if pend is not None:
                return pend
        if "mlx5" in msg or "Port module" in msg:
            pend = rules_host.nic(msg)
            if pend is not None:
                return self._flap(pend)
        if "oom-killer" in msg:
            return rules_host.OomStart(None)
        if "Killed process" in msg:
            return rules_host.oom(msg)
        return rules_host.mce(msg) or rules_kernel.kernel(msg)

    def _flap(self, pend: rules.Pending) -> rules.Pending:
        hit = pend.hit
        if hit is None or hit.pci_raw is None or ("event", "link_down") not in hit.detail:
            return pend
        key = f"{hit.pci_raw}/{dict(hit.detail).get('port', '')}"
        if self._links.get(key) == "up_after_down":
            hit.detail = [("event", "link_flap") if d == ("event", "link_down") else d for d in hit.detail]
            hit.name = hit.name.replace("down", "flap (down again after recovering)")
        if key in self._links or len(self._links) < _CAP:
            self._links[key] = "down"
        return pend

    def _link_up(self, pend: rules_host.LinkUp) -> None:
        if self._links.get(pend.key) == "down":
            self._links[pend.key] = "up_after_down"

    def _remember_uuid(self, msg: str) -> None:
        head, _, uuid = msg.partition("NVRM: GPU at ")[2].removeprefix("PCI:").partition(": ")
        pci = normalise_pci(head)
        if pci and uuid.startswith("GPU-") and (pci in self._uuid or len(self._uuid) < _CAP):
            self._uuid[pci] = uuid.strip()

    def _host_of(self, parsed: Parsed) -> str | None:
        """The line's syslog host; a line without one (a continuation, a dmesg line pasted in) belongs
        to the last host named before it."""
        if parsed.host:
            self._last_host = parsed.host
        return self._last_host

    def _close(self) -> list[Finding]:
        op, self._open = self._open, None
        return [] if op is None else self._finish(op)

    def _finish(self, op: _Open) -> list[Finding]:
        hit = op.pend.finish()
        if hit is None:
            return []
        line, time, uptime = op.line, op.time, op.uptime
        if hit.kind is FindingKind.OOM and self._oom_start is not None:
            start, t0, u0 = self._oom_start
            if 0 <= line - start < 1000:
                line, time, uptime = start, t0 or time, u0 if u0 is not None else uptime
            self._oom_start = None
        self.stats.findings += 1
        if op.host:
            hit.detail.append(("host", op.host))
        return [self._judge(hit, line, time, uptime, "\n".join(op.raw)[:MAX_RAW])]

    def _judge(
        self, hit: rules.Hit, line: int, time: datetime | None, uptime: float | None, raw: str
    ) -> Finding:
        detail = dict(hit.detail)
        stated = hit.stated[0] if hit.stated is not None else None
        if stated is None and hit.kind is FindingKind.SXID and detail.get("sxid_severity") in _NONFATAL:
            stated = Severity.INFO  # the switch itself calls it non-fatal
        pci = normalise_pci(hit.pci_raw) if hit.pci_raw else None
        if pci and pci in self._uuid:
            hit.detail.append(("uuid", self._uuid[pci]))
        peer_note = ""
        if hit.kind is FindingKind.SXID and pci and self.switch_ports is not None and detail.get("link", "").isdigit():
            peer = self.switch_ports.peer(pci, int(detail["link"]))
            if peer is not None:  # the GPU on the far end of the switch port
                hit.detail += [("peer_gpu", str(peer[0])), ("peer_nvlink", str(peer[1]))]
                peer_note = f" [port {detail['link']}: GPU {peer[0]} link {peer[1]}]"
        # Judged here only for offline use (gpufleet diagnose); the agent decodes without a catalog and
        # the controller judges what it reports (domain.judgement: one function, one place).
        if self.catalog is not None:
            j = judge(self.catalog, hit.catalog_kind, hit.code, stated=stated, subcode=detail.get("nvl5_row", ""))
            sev, action, collateral, entry_name = j.severity, j.action, j.collateral, j.name
            if j.basis == "stated by the source" and hit.stated is not None:
                action = hit.stated[1]  # the line decided: its recommended action goes with it
            entry = self.catalog.lookup(hit.catalog_kind, hit.code, subcode=detail.get("nvl5_row", ""))
            coded = hit.code is not None and entry.code == hit.code
            meaning, component = (entry.meaning if coded or not hit.meaning else hit.meaning), entry.component
        else:
            sev = stated or Severity.INFO
            action = hit.stated[1] if hit.stated is not None else Action.NONE
            collateral, entry_name, meaning, component = False, "", hit.meaning, ""
        return Finding(
            kind=hit.kind,
            code=hit.code,
            pci=pci,
            pci_raw=hit.pci_raw,
            time=time,
            uptime=uptime,
            severity=sev,
            action=action,
            name=(hit.name or entry_name or f"{hit.catalog_kind} {hit.code if hit.code is not None else ''}".strip())
            + peer_note,
            meaning=meaning,
            component=component,
            line=line,
            raw=raw,
            catalog_kind=hit.catalog_kind,
            detail=tuple(hit.detail),
            collateral=collateral,
            stated=stated,
            judged=self.catalog is not None,
        )
