"""The transition table: no illegal move is possible, and every state has a way home."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.errors import Conflict
from gpufleet.lifecycle.states import TRANSITIONS, Actor, NodeState, path_home, transition

from .helpers import T0

STATES = list(NodeState)


@given(st.sampled_from(STATES), st.sampled_from(STATES))
def test_transition_accepts_exactly_the_table(src: NodeState, dst: NodeState) -> None:
    if dst in TRANSITIONS[src]:
        t = transition("n1", src, dst, time=T0, reason="because", actor=Actor.POLICY)
        assert (t.from_state, t.to_state, t.reason) == (src, dst, "because")
    else:
        with pytest.raises(Conflict, match="illegal transition"):
            transition("n1", src, dst, time=T0, reason="because", actor=Actor.POLICY)


@pytest.mark.parametrize("state", STATES)
def test_every_state_has_a_legal_path_to_ready_or_retired(state: NodeState) -> None:
    path = path_home(state)
    assert path[0] == state
    assert path[-1] in (NodeState.READY, NodeState.RETIRED)
    for a, b in itertools.pairwise(path):
        assert b in TRANSITIONS[a], f"{a} -> {b} is not in the table"


def test_retired_is_terminal_and_reachable_from_everywhere() -> None:
    assert TRANSITIONS[NodeState.RETIRED] == frozenset()
    for s in STATES:
        if s != NodeState.RETIRED:
            assert NodeState.RETIRED in TRANSITIONS[s]


def test_lifecycle_chain_from_the_issue_is_legal() -> None:
    chain = ["new", "burn_in", "ready", "in_service", "suspect", "draining", "drained", "repair",
             "revalidate", "ready", "in_service", "ready"]
    for a, b in itertools.pairwise(chain):
        transition("n1", NodeState(a), NodeState(b), time=T0, reason="r", actor=Actor.SYSTEM)


def test_a_transition_needs_a_reason() -> None:
    with pytest.raises(Conflict, match="needs a reason"):
        transition("n1", NodeState.READY, NodeState.SUSPECT, time=T0, reason="", actor=Actor.POLICY)


def test_drained_node_cannot_skip_revalidation() -> None:
    for src in (NodeState.DRAINED, NodeState.REPAIR, NodeState.DRAINING):
        assert NodeState.READY not in TRANSITIONS[src]
        assert NodeState.IN_SERVICE not in TRANSITIONS[src]
