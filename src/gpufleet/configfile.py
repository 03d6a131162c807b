"""What the TOML settings loaders (controller.toml, agent.toml) share: the environment's place between
the file and the command line, one bad value turned into an error an operator can act on, and the
seconds settings' type (a number, or a duration like any other)."""

from __future__ import annotations

import difflib
import os
import typing
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ValidationError

from gpufleet.domain.durations import parse_duration
from gpufleet.domain.errors import InvalidInput, validation_expected

SECRET_KEYS = frozenset({"token", "password"})  # never echoed back in an error


def below_environment(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The file's keys that no ``PREFIX<KEY>`` environment variable sets.

    pydantic-settings ranks keyword arguments above the environment; the file's values are passed as
    keyword arguments, so without this the file would silently beat ``GPUFLEET_PORT`` and the like,
    the opposite of what docs/configuration.md promises (file < environment < command line)."""
    env = {name.upper() for name in os.environ}
    return {k: v for k, v in doc.items() if f"{prefix}{k}".upper() not in env}


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _keys_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the table at ``loc`` (a path below ``model``) accepts."""
    for part in loc:
        if isinstance(part, int):
            continue  # an entry of an array of tables: the same model
        field = model.model_fields.get(part)
        nested = _models(field.annotation) if field is not None else []
        if not nested:
            return []
        model = nested[0]
    return list(model.model_fields)


def _hide(value: Any, key: str | int | None) -> Any:
    if key in SECRET_KEYS and value is not None:
        return "<hidden>"
    if isinstance(value, dict):
        return {k: _hide(v, k) for k, v in value.items()}
    return value


def invalid_input(err: ValidationError, model: type[BaseModel]) -> InvalidInput:
    """The first error of ``err`` (a misspelt key first) as an InvalidInput: the dotted key, the value
    (secrets hidden) and what was expected in words (an unknown key: the nearest known ones)."""
    first = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = tuple(first["loc"])
    field = ".".join(str(p) for p in loc) or "config"
    value = _hide(first.get("input"), loc[-1] if loc else None)
    if first["type"] == "extra_forbidden":
        known = _keys_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=3)
        table = ".".join(str(p) for p in loc[:-1] if not isinstance(p, int))
        array = len(loc) > 1 and isinstance(loc[-2], int)  # an entry of [[tokens]], [[spares.pools]]
        where = (f"[[{table}]]" if array else f"[{table}]") if table else "the top level"
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else \
            "see docs/configuration.md for the keys"
        return InvalidInput(field, value, f"a known key: {where} has no {str(loc[-1])!r} ({hint})")
    return InvalidInput(field, value, validation_expected(str(first["msg"])))


def _seconds(value: object) -> float:
    """Seconds: a number, or a duration written like the others ("90s", "5m", "1h30m")."""
    if isinstance(value, bool):
        raise ValueError("a number of seconds or a duration such as 30s or 5m")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return parse_duration(value).total_seconds()
        except InvalidInput as err:
            raise ValueError(f"a number of seconds or {err.expected}") from None
    raise ValueError("a number of seconds or a duration such as 30s or 5m")


Seconds = Annotated[float, BeforeValidator(_seconds)]  # a seconds setting also takes "30s", "5m"
