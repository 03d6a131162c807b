"""``gpufleet version``."""

from __future__ import annotations

import typer

from gpufleet import __version__


def register(app: typer.Typer) -> None:
    @app.command()
    def version() -> None:
        """Print the gpufleet version."""
        typer.echo(__version__)
