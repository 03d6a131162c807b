"""A module for the fork server's own test (tests/integration/test_forkserver.py): ``cli([MODE, FILE])``
writes its pid to FILE, then waits to be killed (``wait``) or raises (``crash``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def cli(args: list[str]) -> None:
    mode, out = args
    Path(out).write_text(str(os.getpid()))
    if mode == "crash":
        raise RuntimeError("the probe crashed on purpose")
    threading.Event().wait()
