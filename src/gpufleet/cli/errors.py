"""How errors become CLI messages and exit codes (the one place that decides it).

Exit codes: 0 ok; 1 the command ran and found a problem (e.g. a fatal fault); 2 usage / invalid
input; 3 not found; 4 conflict; 5 an external system failed.
"""

from __future__ import annotations

import sys

from gpufleet.domain.errors import Conflict, ExternalError, GpufleetError, InvalidInput, NotFound

EXIT_OK = 0
EXIT_FOUND_PROBLEM = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_EXTERNAL = 5


def exit_code_for(err: GpufleetError) -> int:
    if isinstance(err, InvalidInput):
        return EXIT_USAGE
    if isinstance(err, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(err, Conflict):
        return EXIT_CONFLICT
    if isinstance(err, ExternalError):
        return EXIT_EXTERNAL
    return EXIT_FOUND_PROBLEM


def render_error(err: GpufleetError) -> None:
    print(f"gpufleet: error: {err}", file=sys.stderr)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure_logging(level: str) -> None:
    """``--log-level``: checked (a typo is an InvalidInput naming the option, not a ValueError traceback
    from the logging module), then the one format every long-running command logs in."""
    import logging

    if level.upper() not in LOG_LEVELS:
        raise InvalidInput("--log-level", level, ", ".join(LOG_LEVELS[:-1]) + f" or {LOG_LEVELS[-1]}")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
