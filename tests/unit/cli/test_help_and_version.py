"""The CLI's own rough edges: bracketed words survive in help, ``--version``, serve's documented options."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from gpufleet import __version__
from gpufleet.cli import app

runner = CliRunner()


def _help(*args: str) -> str:
    out = runner.invoke(app, [*args, "--help"], terminal_width=200)
    assert out.exit_code == 0, out.output
    return out.output


def test_version_flag_and_command_print_the_package_version() -> None:
    for argv in (["--version"], ["version"]):
        out = runner.invoke(app, argv)
        assert out.exit_code == 0, out.output
        assert __version__ in out.output
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", __version__)


def test_bracketed_words_survive_in_help() -> None:
    assert "[[tokens]]" in _help("controller", "token")
    assert "[[override]]" in _help("diagnose")


def test_serve_documents_host_and_port_with_defaults() -> None:
    text = _help("controller", "serve")
    host = next(line for line in text.splitlines() if "--host" in line)
    port = next(line for line in text.splitlines() if "--port" in line)
    assert "127.0.0.1" in host and "8470" in port


def test_every_command_has_help() -> None:
    root = _help()
    for name in ("fleet", "controller", "agent", "diagnose", "correlate", "sim"):
        assert name in root
    for sub in ("status", "nodes", "node", "drain", "resume", "retire", "approve", "cancel", "breaker", "events"):
        assert sub in _help("fleet")
        _help("fleet", sub)


def test_a_bad_log_level_is_named_not_a_traceback() -> None:
    from gpufleet.domain.errors import InvalidInput

    for argv in (["controller", "serve", "--log-level", "LOUD"],
                 ["agent", "--device", "sim", "--no-push", "--log-level", "LOUD"]):
        out = runner.invoke(app, argv)
        assert isinstance(out.exception, InvalidInput), out.output
        assert (out.exception.field, out.exception.value) == ("--log-level", "LOUD")
        assert "DEBUG, INFO, WARNING or ERROR" in out.exception.expected
    assert "DEBUG, INFO, WARNING or ERROR" in _help("controller", "serve")


def test_serve_help_names_every_scheduler() -> None:
    text = _help("controller", "serve")
    assert "kubernetes" in text and "``" not in text


def test_a_negative_sim_node_count_names_the_option() -> None:
    out = runner.invoke(app, ["controller", "serve", "--sim-nodes", "-3"])
    assert out.exit_code == 2 and "--sim-nodes" in out.output, out.output
