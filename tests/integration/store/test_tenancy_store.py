"""Tenancy moves on both databases: a move resumes after a restart at every pass with each step once, the
owner is written only with the move's completion, and a second move of a node in flight is refused."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import Conflict
from tests.integration.reconciler.test_tenancy_move import TenancyWorld

pytestmark = pytest.mark.tenancy


def test_a_move_resumes_across_restarts_and_hands_over_once(db_url: str) -> None:
    w = TenancyWorld(db_url, nodes=4, racks=2)
    node = w.ids[0]
    m = w.t.move(node, "globex", "admin:root")
    with pytest.raises(Conflict, match="being moved already"):
        w.t.store.begin(m, w.t._audit("tenancy_move", node, "again"))
    assert w.t.store.owners() == {node: None}
    for _ in range(40):
        w.restart()
        w.step()
        w.agents()
        w.validations()
        if w.t.store.get(m.id).state != "running":
            break
    assert w.t.store.get(m.id).state == "done" and w.t.store.owners() == {node: "globex"}
    assert not w.t.store.finish(m.id, False, "late", w.clock.now(), w.t._audit("tenancy_move_failed", node, "x")), \
        "a completed move cannot be completed again"
    assert w.t.store.owners() == {node: "globex"}
    assert [x.id for x in w.t.store.moves(nodes=[node])] == [m.id] and w.t.store.moves(nodes=[w.ids[1]]) == []
    assert w.ran == [(node, f"maint:{m.rollout}:{node}")]
    assert [a for a, _ in w.audit(node)].count("tenancy_handover") == 1
