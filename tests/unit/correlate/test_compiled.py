"""Which build of the engine runs (gpufleet.correlate.compiled) and the build flag's checks (setup.py)."""

from __future__ import annotations

import importlib
import runpy
from pathlib import Path

import pytest

from gpufleet.correlate import compiled

REPO = Path(__file__).resolve().parents[3]


def test_every_listed_module_has_its_source_and_status_says_how_it_was_loaded() -> None:
    """On the dev install every status is False; on the compiled wheel (tests/integration/compiled runs
    this file there too) every one is True: either way it matches the file each module came from."""
    here = Path(compiled.__file__).parent
    assert len(set(compiled.MODULES)) == len(compiled.MODULES)
    status = compiled.status()
    assert set(status) == set(compiled.MODULES)
    for name in compiled.MODULES:
        mod = importlib.import_module(name)
        assert (here / f"{name.rsplit('.', 1)[1]}.py").is_file(), name
        assert mod.__file__ is not None
        assert status[name] == mod.__file__.endswith(".so"), (name, mod.__file__)


def test_describe_says_which_build_and_names_the_modules_left_as_python(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        ({"gpufleet.correlate.engine": True, "gpufleet.correlate.rates": True}, "compiled"),
        ({"gpufleet.correlate.engine": False, "gpufleet.correlate.rates": False}, "python"),
        ({"gpufleet.correlate.engine": False, "gpufleet.correlate.rates": False, "gpufleet.correlate.tails": True},
         "partly compiled (python: engine, rates)"),
    ]
    for status, expected in cases:
        monkeypatch.setattr(compiled, "status", lambda st=status: st)
        assert compiled.describe() == expected


def _ext_modules() -> object:
    return runpy.run_path(str(REPO / "setup.py"), run_name="setup_under_test")["ext_modules"]


def test_the_build_flag_defaults_to_pure_python(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = _ext_modules()
    assert callable(ext)
    for value in (None, "", "0", " 0 "):
        if value is None:
            monkeypatch.delenv("GPUFLEET_COMPILE", raising=False)
        else:
            monkeypatch.setenv("GPUFLEET_COMPILE", value)
        assert ext() == []


def test_a_bad_build_flag_names_the_variable_the_value_and_what_is_expected(monkeypatch: pytest.MonkeyPatch) -> None:
    ext = _ext_modules()
    assert callable(ext)
    monkeypatch.setenv("GPUFLEET_COMPILE", "yes")
    with pytest.raises(SystemExit) as err:
        ext()
    msg = str(err.value)
    assert "GPUFLEET_COMPILE='yes'" in msg and "expected 0" in msg and "or 1" in msg


def test_a_compiled_editable_install_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled modules next to their sources in src/ would shadow every edit."""
    ext = _ext_modules()
    assert callable(ext)
    monkeypatch.setenv("GPUFLEET_COMPILE", "1")
    monkeypatch.setattr("sys.argv", ["setup.py", "editable_wheel", "--dist-dir", "/tmp/x"])
    with pytest.raises(SystemExit) as err:
        ext()
    assert "editable install" in str(err.value) and "make wheel-compiled" in str(err.value)
