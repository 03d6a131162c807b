"""The compiled correlation engine (decision 0109): a wheel built with ``GPUFLEET_COMPILE=1`` loads the
engine's modules as C extensions, streams the same verdicts as the pure-Python package, byte for byte,
and passes the engine's own unit tests.

The wheel is built by ``scripts/compiled_wheel.py`` (as ``make wheel-compiled`` builds it, from the dev
install: mypyc comes with mypy) and installed into a directory put first on ``PYTHONPATH`` of
subprocesses. ``make test`` builds it beside mypy before pytest starts (``GPUFLEET_TEST_COMPILED``: the
directory with its ``dist`` and ``site``, from what ``src/`` held then); without that, or when that build
failed, the first test builds it. The editable dev install that runs this session stays pure Python.
Needs a C compiler and Python's headers (CI has both).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.correlate import compiled
from tests.conftest import require_service

# The build (20-40 s) counts against the first test's limit; the nested test run takes about a minute.
pytestmark = [pytest.mark.compiled, pytest.mark.timeout(900)]
ENGINE_TESTS = ("tests/unit/correlate", "tests/integration/correlation", "tests/unit/controller/test_identity.py",
                "tests/integration/store/test_unit_namings.py", "tests/integration/api/test_inventory.py")

REPO = Path(__file__).resolve().parents[3]


def _run(args: list[str], site: Path | None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*([str(site)] if site else []), str(REPO), *inherited])
    env.pop("GPUFLEET_COMPILE", None)
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _build_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "compiled_wheel.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("GPUFLEET_TEST_COMPILED", "")
    root = Path(built) if built else Path()
    if not (built and (root / "site").is_dir()):  # `make test` builds it beside mypy (Makefile: test-compiled)
        root = tmp_path_factory.mktemp("compiled")
        res = _build_script("--dist", str(root / "dist"), "--site", str(root / "site"))
        require_service(res.returncode != 2, f"what the compiled build needs ({res.stderr.strip()})")
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert Path(res.stdout.splitlines()[-1]) == root / "site"
    root = root.resolve()
    (wheel,) = (root / "dist").glob("gpufleet-*.whl")
    assert "-cp3" in wheel.name and not wheel.name.endswith("-none-any.whl"), wheel.name  # a platform wheel
    return root / "site"


def test_the_wheel_loads_every_listed_module_compiled(site: Path) -> None:
    probe = ("import json; from gpufleet.correlate import compiled, engine; "
             "print(json.dumps({'status': compiled.status(), 'engine': engine.__file__}))")
    res = _run([sys.executable, "-c", probe], site)
    assert res.returncode == 0, res.stderr
    import json

    doc = json.loads(res.stdout)
    assert doc["status"] == {m: True for m in compiled.MODULES}
    assert Path(doc["engine"]).parent == site / "gpufleet" / "correlate"
    assert compiled.status() == {m: False for m in compiled.MODULES}  # this process: the editable install


def test_compiled_and_python_engines_stream_the_same_verdicts(site: Path) -> None:
    cmd = [sys.executable, "-m", "tests.integration.compiled.fingerprint", "3"]
    pure, comp = _run(cmd, None), _run(cmd, site)
    assert pure.returncode == 0, pure.stderr[-3000:]
    assert comp.returncode == 0, comp.stderr[-3000:]
    p_lines, c_lines = pure.stdout.splitlines(), comp.stdout.splitlines()
    assert p_lines[0] == "python" and c_lines[0] == "compiled"
    differ = [f"{a}\n  vs {b}" for a, b in zip(p_lines[1:], c_lines[1:], strict=True) if a != b]
    assert not differ, "\n".join(differ[:10])
    acting = [ln for ln in p_lines[1:] if " observe:0:" not in ln]
    assert len(acting) > (len(p_lines) - 1) // 2  # most streams produced verdicts: it compares something


def test_the_engine_tests_pass_on_the_compiled_build(site: Path) -> None:
    """The engine's tests and the controller's that feed it (correlation, moves, namings) on the
    compiled modules. The tests
    that replace a method on an engine object (``patches_internals``: a compiled class's methods cannot
    be replaced) run only on the pure build, where this session runs them."""
    marked = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                   "-m", "patches_internals", *ENGINE_TESTS], None)
    assert marked.returncode == 0, marked.stdout[-3000:]
    expected = sum(1 for ln in marked.stdout.splitlines() if "::" in ln)
    assert expected >= 1, marked.stdout[-2000:]
    script = (
        "import sys, pytest\n"
        "from gpufleet.correlate.compiled import MODULES\n"
        "rc = pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:xdist', '-m', 'not patches_internals',"
        f" {', '.join(repr(t) for t in ENGINE_TESTS)}])\n"
        "print('loaded:', ' '.join(sys.modules[m].__file__ or '?' for m in MODULES))\n"
        "sys.exit(rc)\n"
    )
    res = _run([sys.executable, "-c", script], site, timeout=900)
    tail = res.stdout[-3000:]
    assert res.returncode == 0, tail
    loaded = res.stdout.rsplit("loaded:", 1)[1].split()
    assert len(loaded) == len(compiled.MODULES) and all(f.endswith(".so") for f in loaded), loaded
    passed, deselected = re.search(r"(\d+) passed", tail), re.search(r"(\d+) deselected", tail)
    assert passed is not None and deselected is not None, tail
    assert int(passed.group(1)) >= 20 and int(deselected.group(1)) == expected, tail
    assert " skipped" not in tail, tail
