"""The coherence statistic's false-alarm budget is the operator's choice (decision 0112): a larger budget
names a weaker pattern, and never takes back a part a smaller budget named."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.cli.errors import exit_code_for
from gpufleet.correlate.engine import Engine
from gpufleet.correlate.model import SuspectAction, VerdictStatus
from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.events import EventKind, HealthEvent
from gpufleet.domain.false_alarms import FALSE_ALARM_BUDGET, false_alarm_budget
from gpufleet.domain.topology import Topology, dump_topology
from gpufleet.domain.topology_gen import generate_hgx

T0 = datetime(2026, 11, 21, 12, tzinfo=UTC)
HGX: Topology = generate_hgx(64)
NODE = "r05-n02"


def _gpu_errors(n: int, gap_s: float = 25.0, node: str = NODE) -> list[HealthEvent]:
    """``n`` GPUs of one node each log one corrected NVLink error, on links to different chips."""
    out = []
    for i in range(n):
        gpu = f"{node}-gpu{i}"
        links = [lid for lid in HGX.links_of(gpu) if HGX.links[lid].kind == "nvlink"]
        out.append(HealthEvent(f"le-{gpu}", node, EventKind.LINK_ERROR, T0 + timedelta(seconds=20 + gap_s * i),
                               gpu, link=links[(5 * i) % len(links)]))
    return out


def _blamed(events: list[HealthEvent], budget: float) -> set[str]:
    engine = Engine(HGX, false_alarm_budget=budget)
    out: set[str] = set()
    for ev in events:
        for v in engine.observe_health_event(ev):
            if v.status is not VerdictStatus.CLEARED and v.suspect.action is not SuspectAction.OBSERVE:
                out.add(v.suspect.component)
    return out


def test_a_larger_budget_names_a_pattern_the_default_leaves_alone() -> None:
    four = _gpu_errors(4)
    assert _blamed(four, FALSE_ALARM_BUDGET) == set()  # 4 of 8 GPUs, one error each: within the default's budget
    assert _blamed(four, 10 * FALSE_ALARM_BUDGET) == {NODE}
    assert _blamed(_gpu_errors(3), 10 * FALSE_ALARM_BUDGET) == set()  # but not any pattern at all


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=8),
    gap=st.floats(min_value=1.0, max_value=200.0),
    low=st.sampled_from([1e-4, 1e-3, 3e-3]),
    factor=st.sampled_from([1.0, 3.0, 10.0, 100.0]),
)
def test_raising_the_budget_never_takes_back_a_named_part(n: int, gap: float, low: float, factor: float) -> None:
    events = _gpu_errors(n, gap)
    assert _blamed(events, low) <= _blamed(events, min(1.0, low * factor))


@pytest.mark.parametrize("bad", [0.0, -1e-3, 1e-320, 1.5, float("nan"), float("inf")])
def test_a_budget_out_of_range_names_the_field(bad: float) -> None:
    for coherence in (True, False):
        with pytest.raises(InvalidInput) as err:
            Engine(HGX, false_alarm_budget=bad, coherence=coherence)
        assert err.value.field == "false_alarm_budget"
    with pytest.raises(InvalidInput) as err:
        false_alarm_budget(bad, "--false-alarm-budget")
    assert str(err.value).startswith("--false-alarm-budget")


def test_the_cli_takes_the_budget_and_refuses_a_bad_one(tmp_path: Path) -> None:
    runner = CliRunner()
    topo = tmp_path / "hgx.json"
    topo.write_text(dump_topology(HGX), encoding="utf-8")
    events = tmp_path / "four.jsonl"
    events.write_text("".join(json.dumps({"time": e.time.isoformat(), "kind": e.kind.value, "component": e.component,
                                          "link": e.link}) + "\n" for e in _gpu_errors(4)), encoding="utf-8")
    args = ["correlate", "--topology", str(topo), "--events", str(events), "--json"]
    quiet = runner.invoke(app, args)
    assert quiet.exit_code == 0, quiet.output  # the default budget: nothing to act on
    assert json.loads(quiet.stdout)["suspects"] == []
    looser = runner.invoke(app, [*args, "--false-alarm-budget", "0.01"])
    assert looser.exit_code == 1, looser.output  # ten times the budget: the node needs action
    assert json.loads(looser.stdout)["suspects"][0]["component"] == NODE
    for cmd in (["correlate-eval"], args):
        res = runner.invoke(app, [*cmd, "--false-alarm-budget", "2"])
        err = res.exception
        assert isinstance(err, InvalidInput) and err.field == "--false-alarm-budget" and err.value == 2.0
        assert exit_code_for(err) == 2  # what `gpufleet` exits with (cli/errors.py)
