"""Time to market's input from the store (``Store.histories``): each node's transitions up to its first
ready, not the years of transitions after it, and the same time to market as from every transition."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Engine

from gpufleet.controller.store.repo import Store
from gpufleet.lifecycle.plan import Plan
from gpufleet.lifecycle.states import Actor, NodeState, transition
from gpufleet.lifecycle.ttm import NodeHistory, Step, cluster_ttm
from tests.integration.store.plans import T0, node_record

S = NodeState
# (node, registered as, its transitions): burned in then a life of faults; burn-in found a fault first;
# registered ready then a fault; still in burn-in
LIVES: dict[str, tuple[NodeState, list[tuple[NodeState, NodeState]]]] = {
    "n1": (S.NEW, [(S.NEW, S.BURN_IN), (S.BURN_IN, S.READY), (S.READY, S.IN_SERVICE), (S.IN_SERVICE, S.SUSPECT),
                   (S.SUSPECT, S.DRAINING), (S.DRAINING, S.DRAINED), (S.DRAINED, S.REPAIR), (S.REPAIR, S.REVALIDATE),
                   (S.REVALIDATE, S.READY), (S.READY, S.SUSPECT), (S.SUSPECT, S.READY)]),
    "n2": (S.NEW, [(S.NEW, S.BURN_IN), (S.BURN_IN, S.REPAIR), (S.REPAIR, S.REVALIDATE), (S.REVALIDATE, S.READY),
                   (S.READY, S.SUSPECT), (S.SUSPECT, S.DRAINING)]),
    "n3": (S.READY, [(S.READY, S.SUSPECT), (S.SUSPECT, S.DRAINING), (S.DRAINING, S.DRAINED)]),
    "n4": (S.NEW, [(S.NEW, S.BURN_IN)]),
}


def test_histories_stop_at_the_first_ready_and_give_the_same_time_to_market(engine: Engine) -> None:
    store = Store(engine)
    store.commit(Plan(), new_nodes=[(node_record(n, reg, T0), "r01", T0) for n, (reg, _) in LIVES.items()])
    full: dict[str, list[Step]] = {n: [] for n in LIVES}
    minute = 0
    for i in range(max(len(life) for _, life in LIVES.values())):  # interleaved, as a fleet writes them
        for n, (_, life) in LIVES.items():
            if i < len(life):
                minute += 1
                a, b = life[i]
                at = T0 + timedelta(minutes=minute)
                store.commit(Plan(transitions=[transition(n, a, b, time=at, reason="test", actor=Actor.POLICY,
                                                          actor_id="policy")]))
                full[n].append(Step(at, a, b))
    read = {h.node: h for h in store.histories()}
    assert [(s.from_state, s.to_state) for s in read["n1"].steps] == LIVES["n1"][1][:2]
    assert [(s.from_state, s.to_state) for s in read["n2"].steps] == LIVES["n2"][1][:4]
    assert [(s.from_state, s.to_state) for s in read["n3"].steps] == LIVES["n3"][1][:1]  # says it was ready
    assert [(s.from_state, s.to_state) for s in read["n4"].steps] == LIVES["n4"][1]
    every = [NodeHistory(n, h.registered, h.state, tuple(full[n])) for n, h in read.items()]
    assert cluster_ttm(read.values()) == cluster_ttm(every)
    assert cluster_ttm(read.values()).failures_found == 1 and cluster_ttm(read.values()).ready == 3
