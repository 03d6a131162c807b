"""Lists of keys in SQL that stay within the databases' parameter limits, whatever the fleet's size:
PostgreSQL binds at most 65,535 parameters to a statement, SQLite's default build 32,766. A caller's list
of job ids (100,000 queued) or of a tenant's nodes (up to the whole fleet) goes through :func:`chunks`
(one statement per slice) or, where a statement cannot be split (a page ordered and cut over the whole
filter), :func:`one_of` (the whole list as one parameter)."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from typing import TypeVar

from sqlalchemy import ColumnElement, SQLColumnExpression, String, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY

CHUNK = 500  # keys per statement

T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    """``items`` in slices of at most ``size``: one statement each where the list is a caller's and can
    be fleet-sized. The store's one chunking helper: every such ``IN`` goes through it."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def one_of(dialect: str, column: SQLColumnExpression[str], values: Collection[str]) -> ColumnElement[bool]:
    """``column IN values`` bound as ONE parameter whatever the number of values, for the filters a
    statement cannot be split on (a page: ORDER BY .. LIMIT .. OFFSET over the whole filter), such as a
    tenant's nodes (up to the whole fleet). PostgreSQL: ``= ANY(:array)``; SQLite: ``IN (SELECT value
    FROM json_each(:json))``."""
    wanted = sorted(values)
    if dialect == "postgresql":
        return column == any_(bindparam(None, wanted, type_=ARRAY(String)))
    if dialect == "sqlite":
        listed = func.json_each(bindparam(None, json.dumps(wanted), type_=String)).table_valued("value")
        return column.in_(select(listed.c.value))
    return column.in_(wanted)  # another database: its own limits
