"""Build gpufleet's wheel with the correlation engine compiled by mypyc (decision 0109).

    python scripts/compiled_wheel.py [--dist DIR] [--site DIR]

Builds what ``src/`` holds now, uncommitted changes included (commit first for a release), from a copy
(the working tree gets no ``build/`` and no ``.so``), with
``GPUFLEET_COMPILE=1`` and no build isolation, so the mypyc of the running Python's mypy is used: run
it with the dev install's Python (``make wheel-compiled`` does). The wheel goes to ``--dist`` (default
``dist/``). With ``--site``, it is also installed there, without dependencies, for
``PYTHONPATH=DIR`` to put in front of an editable install (the compiled-build tests and
``python -m bench compiled`` do that); the last line printed is the wheel, or that directory.
Exits 2 with what is missing when mypyc, a C compiler or Python's headers are not there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE_FILES = ("pyproject.toml", "setup.py", "README.md")


def missing() -> list[str]:
    """What a compiled build needs and this machine lacks (empty: it can build)."""
    out = []
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        out.append("mypyc (it comes with mypy: make install-dev)")
    # setuptools compiles with $CC, else the compiler Python was built with (sysconfig's CC)
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        out.append(f"a C compiler ({cc!r} on PATH; Debian: apt-get install gcc libc6-dev)")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        out.append(f"Python's headers ({sysconfig.get_paths()['include']}/Python.h; Debian: python3-dev)")
    return out


def build(dist: Path, site: Path | None = None) -> Path:
    """The compiled wheel in ``dist`` (installed into ``site`` when given)."""
    dist.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpufleet-compiled-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(REPO / "src", tree / "src",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
        for name in TREE_FILES:
            shutil.copy2(REPO / name, tree / name)
        out = Path(tmp) / "dist"
        t0 = time.monotonic()
        print(f"compiling the correlation engine with mypyc (about 20-40 s) from {tree}", file=sys.stderr, flush=True)
        res = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(out),
             str(tree)],
            env={**os.environ, "GPUFLEET_COMPILE": "1"}, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"the compiled build failed (pip wheel exit {res.returncode}):\n"
                             f"{res.stdout[-4000:]}{res.stderr[-4000:]}")
        (wheel,) = out.glob("gpufleet-*.whl")
        target = dist / wheel.name
        partial = dist / f".{wheel.name}.{os.getpid()}.part"  # a concurrent build never sees half a wheel
        shutil.copy2(wheel, partial)
        os.replace(partial, target)
        print(f"built {target.name} in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    if site is not None:
        shutil.rmtree(site, ignore_errors=True)
        res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                              str(target)], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"installing {target.name} into {site} failed:\n{res.stderr[-4000:]}")
        return site
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dist", type=Path, default=REPO / "dist", help="where the wheel goes (default: dist/)")
    ap.add_argument("--site", type=Path, help="also install the wheel into this directory (no dependencies)")
    args = ap.parse_args(argv)
    lacking = missing()
    if lacking:
        print("cannot build the compiled engine; missing: " + "; ".join(lacking), file=sys.stderr)
        return 2
    print(build(args.dist.resolve(), args.site.resolve() if args.site else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
