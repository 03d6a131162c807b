"""Reading logs: files, ``.gz`` files (nvidia-bug-report.log.gz), stdin — in constant memory.

:func:`decode_stream` reads 1 MiB blocks and finds candidate lines with one multi-word scan of the
whole block (:func:`candidates.starts`), so the many benign lines of a large log are never split,
decoded or parsed one by one; they are only counted.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from gpufleet.diagnose import candidates
from gpufleet.diagnose.decoder import MAX_LINE, Decoder
from gpufleet.diagnose.finding import Finding
from gpufleet.domain.errors import InvalidInput

CHUNK = 1 << 20
_MAX_PENDING = 4 * CHUNK  # a "line" longer than this is cut and the rest skipped up to its newline


def open_log(path: str, stdin: BinaryIO | None = None) -> BinaryIO:
    """Open ``path`` for binary reading; ``-`` is ``stdin``; gzip is detected by its magic bytes."""
    if path == "-":
        if stdin is None:
            raise InvalidInput("FILE", path, "a readable stdin")
        raw: BinaryIO = stdin
    else:
        p = Path(path)
        if not p.is_file():
            raise InvalidInput("FILE", path, "an existing log file, or - for stdin")
        raw = p.open("rb")
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[type-var]
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[return-value]
    return buffered


def decode_stream(stream: BinaryIO, decoder: Decoder) -> Iterator[Finding]:
    """Decode everything ``stream`` yields; the decoder's ``stats`` count every line."""
    rest = b""
    line = 1
    skipping = False  # inside an over-long line whose head was already fed
    # read1 returns what is decoded so far, so a truncated .gz still yields its readable part.
    read = getattr(stream, "read1", stream.read)
    while True:
        try:
            chunk = read(CHUNK)
        except (OSError, EOFError):  # truncated or corrupt .gz: keep what was decoded so far
            decoder.stats.truncated += 1
            break
        if not chunk:
            break
        data = rest + chunk if rest else chunk
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                rest = b""
                continue
            data, skipping = data[nl + 1 :], False
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > _MAX_PENDING:
                decoder.stats.truncated += 1
                yield from decoder.feed(data[:MAX_LINE], line)
                line += 1
                rest, skipping = b"", True
            else:
                rest = data
            continue
        block, rest = data[: cut + 1], data[cut + 1 :]
        if line == 1:
            decoder.prime(block)
        found, line = _scan(decoder, block, line)
        yield from found
    if rest and not skipping:
        decoder.stats.truncated += 1  # last line had no newline: the log was cut off mid-line
        yield from decoder.feed(rest, line)
    yield from decoder.flush()


def _scan(dec: Decoder, block: bytes, line: int) -> tuple[list[Finding], int]:
    """Feed the candidate lines of ``block`` (complete lines) and bulk-count the rest.

    One scan finds where candidate words start (:func:`candidates.starts`); the lines between two
    candidate lines are only counted. A block that is plain ASCII without NULs (the usual case) is
    counted without copying; otherwise each skipped region is checked for binary and invalid UTF-8
    lines.
    """
    out: list[Finding] = []
    pos, n = 0, len(block)
    find, count = block.find, block.count
    clean = block.isascii() and b"\x00" not in block
    hits = candidates.starts(block)
    k, nhits = 0, len(hits)
    while pos < n:
        if dec.wants_every_line:
            end = find(b"\n", pos)
            end = n if end < 0 else end
            out += dec.feed(block[pos:end], line)
            line, pos = line + 1, end + 1
            continue
        while k < nhits and hits[k] < pos:
            k += 1
        hit = hits[k] if k < nhits else n
        i = block.rfind(b"\n", pos, hit) if hit < n else n - 1
        start = pos if i < 0 else i + 1
        if start > pos:
            lines = count(b"\n", pos, start)
            if clean:
                dec.skip_clean(lines, start - pos)
            else:
                dec.skip(block[pos:start], lines)
            line += lines
        if hit == n:
            break
        end = find(b"\n", hit)
        end = n if end < 0 else end
        out += dec.feed(block[start:end], line)
        line, pos = line + 1, end + 1
    return out, line
