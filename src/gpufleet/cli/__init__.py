"""The ``gpufleet`` command line: one Typer app; each sub-command lives in its own module here and
exposes ``register(app)``. Heavy imports happen inside the command bodies so ``gpufleet --help`` is fast.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer

from gpufleet import __version__
from gpufleet.cli.errors import exit_code_for, render_error
from gpufleet.domain.errors import GpufleetError

app = typer.Typer(
    name="gpufleet",
    help="A reliability control plane for GPU training clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help is plain text: Rich markup would eat every bracketed word ("the [[tokens]] entry",
    # "[policy] tables"). Every sub-command inherits this from the root.
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufleet {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="print the version and exit")] = False) -> None:
    """gpufleet: watch, validate, root-cause and heal a GPU fleet."""


# One line per sub-command module (gpufleet.cli.<name>), in the order shown by --help.
_COMMANDS: tuple[str, ...] = (
    "demo",
    "controller",
    "agent",
    "diagnose",
    "check",
    "sim",
    "slurm",
    "version",
    "topology",
    "correlate",
    "fleet",
    "maintenance",
    "spares",
    "goodput",
    "tenancy",
)

for _name in _COMMANDS:
    importlib.import_module(f"gpufleet.cli.{_name}").register(app)


def main() -> None:
    """Console entry point: maps gpufleet's errors to messages and exit codes in one place."""
    try:
        app()
    except GpufleetError as err:
        render_error(err)
        sys.exit(exit_code_for(err))
