"""The error hierarchy shared by every layer.

Each error carries the field path and the offending value so that the API (HTTP status) and the
CLI (exit code) can report *what* was wrong, *where*, and *what was expected* — mapped in one place
each (``controller.api.errors`` and ``cli``).
"""

from __future__ import annotations

from typing import Any


class GpufleetError(Exception):
    """Base class of every error gpufleet raises on purpose."""


class InvalidInput(GpufleetError):
    """Input that does not satisfy the contract: names the field, the value and what was expected."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        super().__init__(f"{field}: got {value!r}, expected {expected}")


class NotFound(GpufleetError):
    """A referenced entity (node, decision, action, ...) does not exist."""

    def __init__(self, what: str, ident: str) -> None:
        self.what = what
        self.ident = ident
        super().__init__(f"{what} {ident!r} not found")


class Conflict(GpufleetError):
    """The request is well formed but not allowed in the current state (e.g. an illegal transition)."""


class ExternalError(GpufleetError):
    """An external system (scheduler, BMC, database) failed. Retried by the caller; never fatal."""

    def __init__(self, system: str, message: str, *, retryable: bool = True) -> None:
        self.system = system
        self.retryable = retryable
        super().__init__(f"{system}: {message}")


class Overloaded(ExternalError):
    """The controller has more work queued than it takes on: try again after ``retry_after_s``."""

    def __init__(self, system: str, message: str, *, retry_after_s: float) -> None:
        super().__init__(system, message, retryable=True)
        self.retry_after_s = retry_after_s


def validation_expected(msg: str) -> str:
    """What a pydantic validation message says was expected, without the library's own prefix
    ("Value error, time must include a timezone" -> "time must include a timezone")."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg
