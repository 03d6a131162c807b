"""Hypothesis state machine over the whole lifecycle engine.

Random evidence, scheduler observations, ticks, operator actions and breaker resets are thrown at a
fleet. Invariants: every node is always in a legal state reached through legal transitions; no
automated decision ever takes more nodes out than the budget allows; and a path home always exists.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpufleet.domain.errors import Conflict
from gpufleet.domain.events import EventKind
from gpufleet.lifecycle.decisions import DecisionStatus
from gpufleet.lifecycle.engine import LifecycleEngine, OperatorOp, SchedObservation
from gpufleet.lifecycle.plan import Plan
from gpufleet.lifecycle.states import SCHEDULABLE, TRANSITIONS, UNAVAILABLE, Actor, NodeState, path_home

from .helpers import T0, engine, ev

NODES = 16
KINDS = [EventKind.XID, EventKind.ECC_DBE, EventKind.CHECK_FAILED, EventKind.CHECK_PASSED, EventKind.LINK_FLAP,
         EventKind.ECC_SBE, EventKind.ROW_REMAP_PENDING, EventKind.THERMAL]
CODES = [13, 31, 43, 45, 48, 63, 79, 94, 95, 74, 119]


class LifecycleMachine(RuleBasedStateMachine):
    eng: LifecycleEngine

    @initialize(start=st.sampled_from([NodeState.READY, NodeState.NEW]))
    def setup(self, start: NodeState) -> None:
        self.eng = engine(NODES, 4, start)
        self.now = T0
        self.first = {n: r.state for n, r in self.eng.nodes.items()}
        self.last = dict(self.first)
        self.operator_out: set[str] = set()

    def _check(self, plan: Plan, before: set[str]) -> None:
        """``before``: the nodes counted unavailable before the step (out, or committed to a drain)."""
        for t in plan.transitions:
            assert t.to_state in TRANSITIONS[t.from_state], t
            assert self.last[t.node] == t.from_state, f"{t.node}: chain broken at {t}"
            self.last[t.node] = t.to_state
        automated = [d for d in plan.decisions if d.status == DecisionStatus.APPLIED and d.actor == Actor.POLICY
                     and d.takes_node_out and d.from_state in SCHEDULABLE and d.node not in before]
        if automated:
            # Automation only takes a node out while the total (whatever took the others out) fits the budget.
            # A node already counted out (committed to a drain after its checkpoint) that escalates to an
            # immediate drain takes nothing more: an operator may have taken others out past the budget since.
            active = [r for r in self.eng.nodes.values() if r.state != NodeState.RETIRED]
            out = self.eng.unavailable()
            assert len(out) <= max(1, int(0.10 * len(active) + 1e-9)), (len(out), len(active))
            for d in automated:
                for dom in self.eng.nodes[d.node].domains:
                    members = {r.node for r in active if dom in r.domains}
                    assert len(out & members) <= max(1, int(0.25 * len(members) + 1e-9)), (dom, out & members)

    @rule(node=st.integers(0, NODES - 1), kind=st.sampled_from(KINDS), code=st.sampled_from(CODES),
          dt=st.integers(1, 3600))
    def evidence(self, node: int, kind: EventKind, code: int, dt: int) -> None:
        self.now += timedelta(seconds=dt)
        name = sorted(self.eng.nodes)[node]
        before = self.eng.unavailable()
        self._check(self.eng.observe([ev(name, kind, self.now, code if kind == EventKind.XID else None)], self.now),
                    before)

    @rule(nodes=st.lists(st.integers(0, NODES - 1), min_size=NODES // 2, max_size=NODES, unique=True))
    def flood(self, nodes: list[int]) -> None:
        self.now += timedelta(seconds=5)
        names = sorted(self.eng.nodes)
        before = self.eng.unavailable()
        self._check(self.eng.observe([ev(names[i], EventKind.CHECK_FAILED, self.now) for i in nodes], self.now), before)

    @rule(jobs=st.lists(st.booleans(), min_size=NODES, max_size=NODES))
    def scheduler(self, jobs: list[bool]) -> None:
        self.now += timedelta(seconds=30)
        obs = {n: SchedObservation(has_jobs=j and r.state not in UNAVAILABLE,
                                   drained_empty=r.state in UNAVAILABLE and not j)
               for (n, r), j in zip(sorted(self.eng.nodes.items()), jobs, strict=True)}
        before = self.eng.unavailable()
        self._check(self.eng.sync(obs, self.now), before)

    @rule()
    def tick(self) -> None:
        self.now += timedelta(minutes=1)
        before = self.eng.unavailable()
        self._check(self.eng.tick(self.now), before)

    @rule(node=st.integers(0, NODES - 1), op=st.sampled_from(list(OperatorOp)))
    def operator(self, node: int, op: OperatorOp) -> None:
        self.now += timedelta(seconds=1)
        name = sorted(self.eng.nodes)[node]
        before = self.eng.unavailable()
        with contextlib.suppress(Conflict):  # refusing an op that does not apply in the state is correct
            self._check(self.eng.operator(name, op, "tester", "", self.now), before)

    @rule(discard=st.booleans())
    def reset(self, discard: bool) -> None:
        self.now += timedelta(seconds=1)
        before = self.eng.unavailable()
        self._check(self.eng.reset_breaker("tester", self.now, discard_held=discard), before)

    @invariant()
    def states_match_history(self) -> None:
        for n, r in self.eng.nodes.items():
            assert r.state == self.last[n]
            home = path_home(r.state)
            assert home[-1] in (NodeState.READY, NodeState.RETIRED)


LifecycleMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestLifecycleMachine = LifecycleMachine.TestCase
