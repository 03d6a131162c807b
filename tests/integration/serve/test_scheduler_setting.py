"""``controller serve`` drives the scheduler its config names, says which, and refuses to guess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.controller.settings import SchedulerKind, load_settings
from gpufleet.domain.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[3]


def config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "controller.toml"
    path.write_text(f'database_url = "sqlite:///{tmp_path / "g.db"}"\nport = 0\n{body}', encoding="utf-8")
    return path


def test_a_config_without_scheduler_is_refused_naming_the_setting(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLEET_SCHEDULER", raising=False)
    with pytest.raises(InvalidInput) as err:
        load_settings(config(tmp_path, ""))
    assert err.value.field == "scheduler" and err.value.value is None
    assert 'scheduler = "slurm"' in err.value.expected and 'scheduler = "sim"' in err.value.expected


@pytest.mark.parametrize(("body", "field", "value"), [
    ('scheduler = "nomad"\n', "scheduler", "nomad"),  # not a scheduler gpufleet drives
    ('schedular = "slurm"\n', "schedular", "slurm"),  # a misspelt key is named, not "scheduler missing"
])
def test_a_wrong_scheduler_setting_names_what_was_given(tmp_path: Path, body: str, field: str, value: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings(config(tmp_path, body))
    assert (err.value.field, err.value.value) == (field, value)


def test_the_environment_can_name_the_scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_SCHEDULER", "slurm")
    assert load_settings(config(tmp_path, "")).scheduler == SchedulerKind.SLURM


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "controller", "serve", *args], cwd=ROOT,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.terminate()
        p.wait(timeout=30)


def first_line(p: subprocess.Popen[str]) -> str:
    assert p.stderr is not None
    return p.stderr.readline().strip()  # blocks until the line is written (or the process exits)


def test_serve_without_scheduler_exits_2_and_says_what_to_write(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUFLEET_SCHEDULER"}
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "controller", "serve", "--config",
                          str(config(tmp_path, ""))], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=env, check=False)
    assert out.returncode == 2, out.stderr
    assert "scheduler: got None" in out.stderr
    assert 'scheduler = "slurm"' in out.stderr and 'scheduler = "sim"' in out.stderr
    assert not (tmp_path / "g.db").exists()  # refused before touching anything


def test_serve_says_it_drives_the_simulated_scheduler(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    procs.append(p := serve("--config", str(config(tmp_path, 'scheduler = "sim"\n')), "--sim-nodes", "3"))
    assert first_line(p) == "gpufleet controller: driving the simulated scheduler (3 nodes)"


def test_serve_says_it_drives_slurm_and_with_which_conf(tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
    conf = tmp_path / "slurm.conf"
    procs.append(p := serve("--config", str(config(tmp_path, f'scheduler = "slurm"\nslurm_conf = "{conf}"\n'))))
    assert first_line(p) == f"gpufleet controller: driving Slurm via scontrol/sinfo/squeue (SLURM_CONF={conf})"
    procs.append(q := serve("--config", str(config(tmp_path, 'scheduler = "slurm"\n')),
                            env={"SLURM_CONF": "/etc/site/slurm.conf"}))
    assert first_line(q).endswith("(SLURM_CONF=/etc/site/slurm.conf)")


def test_sim_options_with_slurm_are_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "gpufleet.cli", "controller", "serve", "--config",
                          str(config(tmp_path, 'scheduler = "slurm"\n')), "--sim-nodes", "4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--sim-nodes: got 4" in out.stderr


def test_serve_on_any_free_port_prints_the_port_it_listens_on(tmp_path: Path,
                                                              procs: list[subprocess.Popen[str]]) -> None:
    """An operations drill: ``port = 0`` printed ``http://127.0.0.1:0/v1`` while it listened elsewhere, and
    the README says to open the port ``serve`` prints."""
    import re
    import time

    import httpx

    procs.append(p := serve("--config", str(config(tmp_path, 'scheduler = "sim"\n')), "--sim-nodes", "2"))
    assert p.stderr is not None
    line = ""
    while "controller on http" not in line:
        line = p.stderr.readline()
        assert line, "serve exited before saying where it listens"
    m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
    assert m and int(m.group(1)) != 0, line
    url = f"http://127.0.0.1:{m.group(1)}/v1/health"
    r = None
    for _ in range(600):  # the line comes just before uvicorn binds: poll until it answers
        assert p.poll() is None, "serve exited"
        try:
            r = httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.05)  # polling for the bind, not timing
    assert r is not None, f"nothing answered at {url}"
    assert r.status_code == 401 and "bearer token" in r.text, r.text  # the controller (no tokens configured)
