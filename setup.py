"""Build hook for the optional compiled correlation engine (decision 0109; pyproject.toml has the rest).

``GPUFLEET_COMPILE=1`` compiles the modules listed in ``gpufleet.correlate.compiled.MODULES`` with mypyc
(needs mypy, a C compiler and Python's headers: ``make wheel-compiled`` builds such a wheel from the dev
install). Unset or ``0``: the pure-Python package, as always (``pip install -e .`` included).
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FLAG = "GPUFLEET_COMPILE"


def ext_modules() -> list[Any]:
    """The extension modules to build: none, or the mypyc-compiled engine modules."""
    flag = os.environ.get(FLAG, "0").strip()
    if flag in ("", "0"):
        return []
    if flag != "1":
        raise SystemExit(f"{FLAG}={flag!r}: expected 0 (pure Python, the default) or 1 (compile the "
                         "correlation engine with mypyc)")
    if any(cmd in sys.argv for cmd in ("develop", "editable_wheel")):
        raise SystemExit(f"{FLAG}=1 with an editable install: the compiled modules would sit next to their "
                         "sources in src/ and shadow every edit; build a wheel (make wheel-compiled)")
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        raise SystemExit(f"{FLAG}=1 needs mypy (which ships mypyc) where the wheel is built: build from the "
                         "dev install with `pip wheel --no-build-isolation` (make wheel-compiled)") from e
    modules = runpy.run_path(str(HERE / "src/gpufleet/correlate/compiled.py"))["MODULES"]
    paths = [f"src/{m.replace('.', '/')}.py" for m in modules]
    return list(mypycify(paths, opt_level="3", group_name="gpufleet.correlate._compiled"))


if __name__ == "__main__":  # as setuptools' build backend runs it
    from setuptools import setup

    setup(ext_modules=ext_modules())
