"""Moving a node between tenants (docs/tenancy.md): real store, lifecycle engine, reconciler, maintenance
runner and agent command queue, the simulated scheduler and a manual clock (the harness of
test_maintenance.py). The node's agent is played by answering its commands as the API does; the
validation job by posting the check event it would post. (A real controller process SIGKILLed
mid-reprovision: tests/integration/crash/test_tenancy_crash.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.controller.settings import TenancySettings, load_settings
from gpufleet.controller.tenancy import Tenancy
from gpufleet.domain.errors import Conflict, InvalidInput
from gpufleet.domain.events import EventKind
from gpufleet.domain.tenancy import Tenant, check_pools
from gpufleet.lifecycle.engine import OperatorOp
from tests.integration.reconciler.test_maintenance import World

pytestmark = pytest.mark.tenancy

TENANTS = (Tenant("acme", ("r01-*",), 0x0A01), Tenant("globex", ("r02-*",), 0x0A02))
WIPE = TenancySettings(wipe="script:reimage")


class TenancyWorld(World):
    settings = WIPE

    def restart(self) -> None:
        super().restart()
        self.t = Tenancy(self.m, TENANTS, self.settings)
        self.r.tenancy = self.t

    def until(self, move: str, passes: int = 40, fail: frozenset[str] = frozenset(),
              verdict: EventKind = EventKind.CHECK_PASSED) -> str:
        for _ in range(passes):
            self.step()
            self.agents(fail)
            self.validations(verdict)
            state = self.t.store.get(move).state
            if state != "running":
                return state
        return self.t.store.get(move).state


@pytest.fixture
def w(tmp_path: Path) -> TenancyWorld:
    return TenancyWorld(f"sqlite:///{tmp_path / 'g.db'}")


def test_a_move_drains_wipes_validates_and_only_then_hands_over(w: TenancyWorld) -> None:
    node = w.ids[0]
    assert w.t.owner(node) == "acme" and node in w.t.nodes_of("acme")
    m = w.t.move(node, "globex", "admin:root", "rebalancing")
    assert w.t.owner(node) is None, "released at once: no tenant sees it while it is reprovisioned"
    seen = set()
    for _ in range(40):
        w.step()
        if w.t.store.get(m.id).state == "running":
            assert w.t.owner(node) is None
            seen.add(w.c.state_of(node))
        w.agents()
        w.validations()
        if w.t.store.get(m.id).state != "running":
            break
    assert w.t.store.get(m.id).state == "done" and w.t.owner(node) == "globex"
    assert {"draining", "repair", "revalidate"} <= seen | {"draining"}
    assert w.ran == [(node, f"maint:{m.rollout}:{node}")], "the wipe ran once"
    assert w.repairs.command(f"maint:{m.rollout}:{node}").kind == "script:reimage"  # type: ignore[union-attr]
    steps = [a for a, _ in w.audit(node) if a.startswith(("tenancy_", "maintenance_"))]
    assert steps == ["tenancy_move", "maintenance_draining", "maintenance_action", "maintenance_validating",
                     "maintenance_done", "tenancy_handover"]
    assert w.c.state_of(node) == "ready"
    # after a restart the store's owner wins over the configured pool
    w.restart()
    assert w.t.owner(node) == "globex" and node not in w.t.nodes_of("acme")


@pytest.mark.parametrize("how", ["wipe fails", "validation fails", "rollout aborted"])
def test_a_failed_step_leaves_the_node_without_a_tenant_and_out(w: TenancyWorld, how: str) -> None:
    node = w.ids[1]
    m = w.t.move(node, "globex", "admin:root")
    if how == "rollout aborted":
        w.step()
        w.m.abort(m.rollout, "operator:alice", "not now")
    state = w.until(m.id, fail=frozenset({node}) if how == "wipe fails" else frozenset(),
                    verdict=EventKind.CHECK_FAILED if how == "validation fails" else EventKind.CHECK_PASSED)
    assert state == "failed"
    assert w.t.owner(node) is None, "never handed over without a completed reprovision"
    for _ in range(5):  # and it stays that way
        w.step()
        w.agents()
        w.validations()
    assert w.t.owner(node) is None and w.t.store.get(m.id).state == "failed"
    assert "tenancy_move_failed" in [a for a, _ in w.audit(node)]
    assert "tenancy_handover" not in [a for a, _ in w.audit(node)]
    if how != "rollout aborted":
        assert w.c.state_of(node) in ("repair", "drained", "failed"), "out of service"


def test_moves_that_cannot_start_are_refused(w: TenancyWorld, tmp_path: Path) -> None:
    node = w.ids[0]
    with pytest.raises(InvalidInput, match="to: got 'initech'"):
        w.t.move(node, "initech", "admin:root")
    with pytest.raises(Conflict, match="belongs to tenant 'acme' already"):
        w.t.move(node, "acme", "admin:root")
    m = w.t.move(node, "globex", "admin:root")
    with pytest.raises(Conflict, match="being moved already"):
        w.t.move(node, "acme", "admin:root")
    w.step()
    assert w.c.state_of(node) != "ready", "the move has begun its drain"
    with pytest.raises(Conflict, match=f"being moved already \\({m.id}\\)") as refused:
        w.t.move(node, "acme", "admin:root")
    assert "resume or repair" not in str(refused.value), "a running move is not the operator's to resume"
    other = w.ids[1]
    w.c.operate(other, OperatorOp.DRAIN, "admin:root", "bad fan")
    with pytest.raises(Conflict, match=f"node {other} is \\w+: only a serving node"):
        w.t.move(other, "globex", "admin:root")
    assert w.until(m.id) == "done"
    w.settings = TenancySettings()
    w.restart()
    with pytest.raises(Conflict, match="wipe"):
        w.t.move(w.ids[2], "globex", "admin:root")


def test_a_restart_at_every_step_resumes_and_runs_nothing_twice(w: TenancyWorld) -> None:
    node = w.ids[4]
    m = w.t.move(node, "acme", "admin:root")
    seen = []
    for _ in range(40):
        w.restart()  # a new controller on the same database before every pass
        w.step()
        seen.append(w.c.state_of(node))
        w.agents()
        w.validations()
        if w.t.store.get(m.id).state != "running":
            break
    assert w.t.store.get(m.id).state == "done" and w.t.owner(node) == "acme"
    assert w.ran == [(node, f"maint:{m.rollout}:{node}")]
    actions = [a for a, _ in w.audit(node)]
    for once in ("tenancy_move", "maintenance_draining", "maintenance_action", "maintenance_validating",
                 "maintenance_done", "tenancy_handover"):
        assert actions.count(once) == 1, (once, actions)


def test_bad_tenant_config_names_the_field_the_value_and_what_was_expected() -> None:
    def load(**kw: object) -> None:
        load_settings(None, scheduler="sim", **kw)

    with pytest.raises(InvalidInput) as e:
        load(tenant=[{"name": "a", "nodes": ["r01-*"], "pkey": "0x8001"}])
    assert (e.value.field, e.value.value) == ("tenant[0].pkey", "0x8001") and "0x0001..0x7ffe" in e.value.expected
    with pytest.raises(InvalidInput) as e:
        load(tenant=[{"name": "a", "nodes": ["r01-*"], "pkey": "0x0a01"}, {"name": "b", "nodes": ["r02-*"],
                                                                          "pkey": "0x0A01"}])
    assert e.value.field == "tenant[1].pkey" and "not used by tenant 'a'" in e.value.expected
    with pytest.raises(InvalidInput) as e:
        load(tenant=[{"name": "a", "nodes": ["r01-*"]}, {"name": "b", "nodes": ["r01-n001"]}])
    assert (e.value.field, e.value.value) == ("tenant[1].nodes", "r01-n001") and "'a'" in e.value.expected
    with pytest.raises(InvalidInput) as e:
        load(tenant=[{"name": "a", "nodes": ["r01 n1"]}])
    assert (e.value.field, e.value.value) == ("tenant[0].nodes", "r01 n1")
    with pytest.raises(InvalidInput) as e:
        load(tenant=[{"name": "A!", "nodes": ["*"]}])
    assert e.value.field == "tenant[0].name"
    with pytest.raises(InvalidInput) as e:
        load(tenant=[{"name": "a", "nodes": ["*"]}],
             tokens=[{"name": "t", "role": "viewer", "token": "x" * 20, "tenant": "b"}])
    assert (e.value.field, e.value.value) == ("tokens[0].tenant", "b")
    with pytest.raises(InvalidInput, match="tenant applies to viewer and operator"):
        load(tenant=[{"name": "a", "nodes": ["*"]}],
             tokens=[{"name": "t", "role": "admin", "token": "x" * 20, "tenant": "a"}])
    # against the registered nodes (at start): a pattern matching none, overlapping globs
    nodes = ["r01-n001", "r02-n004"]
    with pytest.raises(InvalidInput) as e:
        check_pools((Tenant("a", ("r01-*", "r09-*")),), nodes)
    assert (e.value.field, e.value.value) == ("tenant[0].nodes", "r09-*") and "registered node" in e.value.expected
    with pytest.raises(InvalidInput) as e:
        check_pools((Tenant("a", ("r01-*",)), Tenant("b", ("*-n001",))), nodes)
    assert (e.value.field, e.value.value) == ("tenant[1].nodes", "r01-n001") and "overlap" in e.value.expected
    check_pools(TENANTS, [])  # a first start: nothing registered yet
