"""Writing files that other programs read while we write them (slurmd's health check, slurmctld,
an agent restarted mid-write): the reader sees the old content or the new, never half of either."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: written to a temporary file beside it, flushed to disk, renamed
    over it (a rename within one directory is atomic on POSIX filesystems). The file keeps the mode of
    the one it replaces (0644 when new)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.chmod(mode)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_if_changed(path: Path, text: str) -> bool:
    """:func:`write_atomic` unless ``path`` already holds ``text``; True when it wrote."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    write_atomic(path, text)
    return True
