"""A site override can name one decoded subcode row of an XID 144-150 (issue #15), not only the code."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.domain.catalog import load_default_catalog
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent, Severity
from gpufleet.domain.judgement import judge, judge_event

BASE = load_default_catalog()
ROWS = sorted(r for k, c, r in BASE.subcodes if (k, c) == ("xid", 144))
ROW, OTHER = ROWS[0], ROWS[1]


def test_an_override_of_one_row_leaves_the_other_rows_of_the_code_as_shipped() -> None:
    shipped = judge(BASE, "xid", 144, subcode=ROW).severity
    target = Severity.FATAL if shipped != Severity.FATAL else Severity.INFO
    site = BASE.with_overrides({"override": [{"kind": "xid", "code": 144, "subcode": ROW,
                                              "severity": target.value}]})
    mine = judge(site, "xid", 144, subcode=ROW)
    assert (mine.severity, mine.basis) == (target, "site override")
    assert judge(site, "xid", 144, subcode=OTHER) == judge(BASE, "xid", 144, subcode=OTHER)


def test_a_row_override_beats_a_code_override_which_still_judges_the_other_rows() -> None:
    site = BASE.with_overrides({"override": [
        {"kind": "xid", "code": 144, "severity": "degraded"},
        {"kind": "xid", "code": 144, "subcode": ROW, "severity": "fatal"}]})
    assert judge(site, "xid", 144, subcode=ROW).severity == Severity.FATAL
    assert judge(site, "xid", 144, subcode=OTHER).severity == Severity.DEGRADED
    assert judge(site, "xid", 144).severity == Severity.DEGRADED


def test_the_controllers_event_path_reads_the_row_from_the_event() -> None:
    site = BASE.with_overrides({"override": [{"kind": "xid", "code": 144, "subcode": ROW, "severity": "fatal"}]})
    ev = HealthEvent("e1", "r01-n01", EventKind.XID, datetime(2026, 11, 26, tzinfo=UTC), "r01-n01-gpu0", 144,
                     attrs=(("nvl5_row", ROW),))
    assert judge_event(site, ev).severity == Severity.FATAL


@pytest.mark.parametrize(("item", "expected"), [
    ({"kind": "xid", "code": 144, "subcode": "NO_SUCH_ROW"}, "decoded rows of xid 144"),
    ({"kind": "xid", "code": 79, "subcode": ROW}, "has no decoded subcode rows"),
    ({"kind": "xid", "subcode": ROW}, "has no decoded subcode rows"),
    ({"kind": "xid", "code": 144, "subcode": 7}, "decoded rows of xid 144"),
])
def test_a_bad_row_is_refused_naming_the_field_and_nothing_is_applied(item: dict[str, object],
                                                                       expected: str) -> None:
    doc = {"override": [{"kind": "xid", "code": 13, "severity": "fatal"}, item]}
    with pytest.raises(InvalidInput) as err:
        BASE.with_overrides(doc)
    assert err.value.field == "override[1].subcode"
    assert expected in str(err.value)
