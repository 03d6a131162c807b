"""Walk one event's code path, kernel line to decision, and count its judgements: exactly one.

The agent's real follower and decoder read a /dev/kmsg record, the event goes through the wire form
the spool stores and the API's validator, then the controller's real ingest (identity, judgement,
store, correlator, policy). ``domain.judgement.calls`` counts every call of the one judging function;
a second judgement anywhere on the path (the agent judging again, the policy or the correlator
re-judging instead of reading the attached judgement) makes this test fail.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufleet.agent.clock import FakeClock
from gpufleet.agent.collectors.kmsg import KmsgFollower
from gpufleet.agent.decoding import DiagnoseDecoder
from gpufleet.controller.api.schemas import EventIn
from gpufleet.controller.clock import ManualClock
from gpufleet.controller.service import Controller
from gpufleet.controller.store.db import migrate, throwaway_engine
from gpufleet.controller.store.repo import Store
from gpufleet.domain import judgement
from gpufleet.domain.fleet import Node
from gpufleet.domain.topology_gen import generate_hgx
from gpufleet.domain.wire import dumps
from gpufleet.lifecycle.config import parse_policy
from gpufleet.lifecycle.states import NodeState

BTIME = 1795000000
LINE = "4,1002,81234567,-;NVRM: Xid (PCI:0000:18:00): 31, pid=1234, name=python, Ch 00000008, MMU Fault"


def _agent_events(tmp_path: Path, node: str) -> list[dict[str, object]]:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("b1\n")
    (proc / "stat").write_text(f"btime {BTIME}\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(LINE + "\n")
    follower = KmsgFollower(node, DiagnoseDecoder(node, {"0000:18:00.0": f"{node}-gpu0"}), clock=FakeClock(),
                            kmsg_path=kmsg, proc_root=proc)
    follower.start()
    try:
        return [json.loads(dumps(e)) for e in follower.poll()]  # what the spool stores and the pusher sends
    finally:
        follower.close()


def test_one_kernel_log_xid_is_judged_exactly_once_on_its_way_to_a_decision(tmp_path: Path) -> None:
    topo = generate_hgx(4)
    node = "r01-n01"
    assert node in topo
    before = judgement.calls
    wire = _agent_events(tmp_path, node)
    assert judgement.calls == before, "the agent judged an event (it must only observe)"
    assert [(w["kind"], w["code"], w["severity"]) for w in wire] == [("xid", 31, None)]

    # The site makes XID 31 fatal; the controller, not the agent, applies it.
    policy = parse_policy({"override": [{"kind": "xid", "code": 31, "severity": "fatal"}]})
    engine = throwaway_engine()
    migrate(engine)
    when = datetime.fromtimestamp(BTIME, UTC) + timedelta(seconds=90)
    ctl = Controller(Store(engine), policy, ManualClock(when), topology=topo)
    ctl.register([Node(node, "r01")], state=NodeState.READY)
    events = [EventIn.model_validate(w).to_domain() for w in wire]
    before = judgement.calls
    result = ctl.ingest(events)
    assert judgement.calls - before == len(events) == 1, "an event was judged more than once on the way"
    assert result.decisions == 1 and ctl.state_of(node) is NodeState.DRAINING
    [row] = ctl.store.events(node=node)
    assert row.severity == "fatal" and row.component == f"{node}-gpu0"  # stored as judged and named
