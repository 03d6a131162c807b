"""``gpufleet diagnose FILE|- [--json] [--policy FILE] [--catalog FILE] [--inventory FILE] [--nvlink FILE]
[--tz ZONE] [--width N]``.

Exit codes: 0 nothing fatal found; 1 something fatal found; 2 usage or input errors.
"""

from __future__ import annotations

from datetime import tzinfo
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def diagnose(
        file: Annotated[str, typer.Argument(help="kernel log, nvidia-bug-report.log(.gz), or - for stdin")],
        json_out: Annotated[bool, typer.Option("--json", help="print a JSON array of findings")] = False,
        catalog: Annotated[
            Path | None, typer.Option("--catalog", help="TOML with [[override]] / [[escalation]] tables")
        ] = None,
        policy: Annotated[
            Path | None, typer.Option("--policy", help="the controller's policy file: judge with its overrides")
        ] = None,
        inventory: Annotated[
            Path | None, typer.Option("--inventory", help="TOML/JSON/nvidia-smi CSV: PCI -> GPU and node")
        ] = None,
        nvlink: Annotated[
            Path | None, typer.Option("--nvlink", help="output of nvidia-smi nvlink -R: SXid switch port -> GPU")
        ] = None,
        year: Annotated[
            int | None, typer.Option("--year", help="year of timestamps without one (default: the file's)")
        ] = None,
        tz: Annotated[
            str, typer.Option("--tz", help="zone of timestamps written without one (syslog, journal): "
                              "UTC, local, or a name such as Europe/Paris")
        ] = "UTC",
        width: Annotated[
            int | None, typer.Option("--width", min=0, help="cut findings to this many columns (0: never cut; "
                                     "default: the terminal's width, or never when not a terminal)")
        ] = None,
    ) -> None:
        """Decode kernel logs and NVIDIA bug reports into hardware events, worst first."""
        import sys
        import tomllib
        from datetime import UTC, datetime

        from gpufleet.cli.errors import EXIT_FOUND_PROBLEM, exit_code_for, render_error
        from gpufleet.diagnose.decoder import Decoder
        from gpufleet.diagnose.inventory import load_inventory
        from gpufleet.diagnose.nvlink_remote import load_nvlink_remote
        from gpufleet.diagnose.reader import decode_stream, open_log
        from gpufleet.diagnose.report import analyse, render_json, render_table
        from gpufleet.domain.catalog import load_default_catalog
        from gpufleet.domain.errors import GpufleetError, InvalidInput
        from gpufleet.lifecycle.config import load_policy

        try:
            # The same catalog the controller judges with: shipped + the policy file's overrides (+ --catalog).
            cat = load_policy(policy).catalog if policy is not None else load_default_catalog()
            if catalog is not None:
                if not catalog.is_file():
                    raise InvalidInput("--catalog", str(catalog), "an existing TOML file")
                try:
                    doc = tomllib.loads(catalog.read_text(encoding="utf-8"))
                except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
                    raise InvalidInput("--catalog", str(catalog), f"valid TOML ({err})") from None
                cat = cat.with_overrides(doc, source=str(catalog))
            inv = load_inventory(inventory) if inventory is not None else None
            ports = load_nvlink_remote(nvlink) if nvlink is not None else None
            if year is not None and not 1970 <= year <= 9999:
                raise InvalidInput("--year", year, "a year from 1970 to 9999 (of timestamps written without one)")
            stream = open_log(file, sys.stdin.buffer)
            if year is None:
                mtime = Path(file).stat().st_mtime if file != "-" else None
                year = datetime.fromtimestamp(mtime, UTC).year if mtime else datetime.now(UTC).year
            decoder = Decoder(cat, year=year, tz=_zone(tz), switch_ports=ports)
            with stream:
                report = analyse(decode_stream(stream, decoder), cat, decoder.stats, inv)
        except GpufleetError as err:
            render_error(err)
            raise typer.Exit(exit_code_for(err)) from None
        if json_out:
            typer.echo(render_json(report))
            st = report.stats
            notes = {"binary_lines": st.binary, "invalid_utf8_lines": st.invalid_utf8,
                     "truncated_lines": st.truncated, "xid_lines_not_understood": st.undecoded,
                     "repeated_findings_not_kept": report.suppressed}
            if any(notes.values()):
                typer.echo("gpufleet diagnose: input: " + ", ".join(f"{k}={v}" for k, v in notes.items()),
                           err=True)
        else:
            if width is None and sys.stdout.isatty():
                import shutil

                width = shutil.get_terminal_size().columns
            typer.echo(render_table(report, file, width or None, zone=tz))
        if report.fatal:
            raise typer.Exit(EXIT_FOUND_PROBLEM)


def _zone(name: str) -> tzinfo:
    """``--tz``: UTC, local (this machine's zone now), or an IANA zone name."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from gpufleet.domain.errors import InvalidInput

    if name.upper() == "UTC":
        return UTC
    if name == "local":
        local = datetime.now().astimezone().tzinfo
        return local if local is not None else UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput("--tz", name, "UTC, local, or a zone name such as Europe/Paris") from None
