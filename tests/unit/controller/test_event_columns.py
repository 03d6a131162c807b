"""``convert.EVENT_COLUMNS`` feeds ``convert.event_from`` by position (a plain select's rows): the two
must name the same fields in the same order, or a replay would read a node as a kind."""

from __future__ import annotations

import inspect

from gpufleet.controller.store.convert import EVENT_COLUMNS, event_from


def test_the_columns_are_event_froms_parameters_in_order() -> None:
    params = list(inspect.signature(event_from).parameters)
    columns = [c.key for c in EVENT_COLUMNS]
    assert len(params) == len(columns)
    assert ["id" if p == "eid" else p for p in params] == columns
