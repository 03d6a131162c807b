"""What must hold after failovers, read from the database and the shared scheduler state."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import create_engine, text

from gpufleet.lifecycle.states import TRANSITIONS, UNAVAILABLE, NodeState


def check_invariants(db_url: str, workdir: Path, accepted: set[str]) -> dict[str, int]:
    """Every acknowledged event stored; no scheduler effect twice; every drain for an applied decision
    and recorded done once; every node in a legal state reached by legal transitions, matching the
    scheduler. Returns a few counts for the test's messages."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as db:
            stored = set(db.scalars(text("select id from events")))
            lost = accepted - stored
            assert not lost, f"{len(lost)} acknowledged events lost, e.g. {sorted(lost)[:5]}"
            doc = json.loads((workdir / "scheduler.json").read_text())
            effects = [tuple(e) for e in doc["effects"]]
            assert len(effects) == len(set(effects)), "a scheduler effect happened twice"
            drains = [e for e in effects if e[0] == "drain"]
            applied = set(db.scalars(text("select id from decisions where status = 'applied'")))
            for _what, node, reason in drains:
                did = reason.removeprefix("gpufleet:").split(" ", 1)[0]
                assert did in applied, f"{node} drained for unknown decision {did}"
            done = list(db.execute(text("select node, decision_id from actions where kind in ('drain', "
                                        "'drain_after_checkpoint') and status = 'done'")))
            assert len(done) == len({d for _n, d in done}), "one decision's drain recorded done twice"
            assert {n for _w, n, _r in drains} == {n for n, _d in done}
            sched = {n[0]: n for n in doc["nodes"]}
            nodes = list(db.execute(text("select id, state from nodes")))
            for node, state in nodes:
                chain = list(db.execute(text("select from_state, to_state from transitions where node = :n "
                                             "order by seq"), {"n": node}))
                current = NodeState.READY
                for f, t in chain:
                    assert NodeState(f) == current, f"{node}: transition from {f} but the node was {current}"
                    assert NodeState(t) in TRANSITIONS[NodeState(f)], f"{node}: illegal {f} -> {t}"
                    current = NodeState(t)
                assert NodeState(state) == current, f"{node}: row says {state}, transitions say {current}"
                if NodeState(state) in UNAVAILABLE:
                    assert sched[node][1], f"{node} is {state} but not drained in the scheduler"
                if NodeState(state) in (NodeState.READY, NodeState.IN_SERVICE):
                    assert not sched[node][1], f"{node} is {state} but drained in the scheduler"
            return {"events": len(stored), "drains": len(drains), "nodes": len(nodes)}
    finally:
        engine.dispose()
