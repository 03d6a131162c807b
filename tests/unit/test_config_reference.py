"""docs/configuration.md is what scripts/config_reference.py makes of the settings models, so it cannot drift."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpufleet.agent.config import AgentConfig
from gpufleet.controller.settings import ControllerSettings
from gpufleet.lifecycle.config import PolicyConfig

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"


def _check(page: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py"), "--check", str(page)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def test_the_committed_page_matches_the_generator() -> None:
    out = _check(PAGE)
    assert out.returncode == 0, out.stderr


def test_a_stale_page_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(PAGE.read_text(encoding="utf-8").replace("`8470`", "`8471`"), encoding="utf-8")
    out = _check(stale)
    assert out.returncode == 1 and "stale" in out.stderr


def test_every_key_of_every_file_is_on_the_page() -> None:
    text = PAGE.read_text(encoding="utf-8")
    keys = [*ControllerSettings.model_fields, *AgentConfig.model_fields, *PolicyConfig.__dataclass_fields__]
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert missing == []


def test_every_key_says_what_it_means() -> None:
    """A row's last cell (its meaning) comes from the comment beside the key in the source: none empty."""
    rows = [line for line in PAGE.read_text(encoding="utf-8").splitlines()
            if line.startswith("| `") and line.endswith("|")]
    assert len(rows) > 50
    unexplained = [row.split("|")[1].strip() for row in rows if not row.rstrip("|").rsplit("|", 1)[1].strip()]
    assert unexplained == []
