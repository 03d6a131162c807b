"""Correlation from the agents' own events, end to end: agent processes with simulated devices report
what they saw in local names (HCA, GPU index, NVLink number); the controller names it with topology ids
and its correlator blames the shared part (a leaf switch, an NVSwitch chip) or follows a moved tray.

The scheduler does not matter here (the simulated one takes the drains); decisions, verdicts and the
audit log are read from the controller's API.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import (
    ADMIN_TOKEN,
    BASE_POLICY,
    REPO,
    Controller,
    Fleet,
    TopologyFile,
    child_env,
    gpufleet_argv,
    wait_until,
)

pytestmark = pytest.mark.e2e

# A link event toward a switch waits this long for the correlator before the per-node policy sees it
# (policy.correlation_hold; 20 s by default, shortened so the test sees the hold end).
MOVED = "moved"  # the event kind the controller emits when a serial shows up at a new slot
HOLD_POLICY = BASE_POLICY.replace("[policy]\n", '[policy]\ncorrelation_hold = "2s"\n')


def _component_groups(decisions: list[dict[str, Any]]) -> set[str]:
    return {d["actor_id"] for d in decisions if d["rule"] == "component_fault"}


def _evidence_nodes(ctl: Controller, refs: list[Any]) -> set[str]:
    """The reporting nodes of the events a decision or verdict cites (event ids are per node)."""
    events = ctl.api.events()
    wanted = {str(r) for r in refs}
    return {e["node"] for e in events if e["id"] in wanted}


def test_a_failing_leaf_seen_by_the_agents_ib_events_is_one_decision(fleet: Fleet, tmp_path: Path) -> None:
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "4")
    nodes = sorted(topo.racks())
    rail = 5
    # The leaf of rail 5, read from the topology file: the far end of r01-n01-nic5's InfiniBand cable.
    (cable,) = topo.links_of(f"{nodes[0]}-nic{rail}", "ib")
    leaf = cable["b"] if cable["a"] == f"{nodes[0]}-nic{rail}" else cable["a"]
    assert topo.component(leaf)["kind"] == "leaf_switch"
    behind = {n for n in nodes if any(leaf in (lk["a"], lk["b"]) for lk in topo.links_of(f"{n}-nic{rail}", "ib"))}
    assert behind == set(nodes), "an HGX scalable unit: every node's rail-5 NIC lands on the same leaf"

    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path, policy=HOLD_POLICY)
    reporters = nodes[:3]
    for n in reporters:
        fleet.agent(n, "--inject", f"ib_down@nic{rail}", wait=False)

    # The agents' link events arrive named with the topology's cable ids.
    def link_events() -> dict[str, list[dict[str, Any]]]:
        return {n: [e for e in ctl.api.events(n) if e["kind"] in ("link_down", "link_flap", "link_error")]
                for n in reporters}

    seen = wait_until(lambda: all((x := link_events()).values()) and x,
                      lambda: f"link events from {reporters}: {link_events()}")
    for n, evs in seen.items():
        assert {e["link"] for e in evs} == {f"{n}-nic{rail}~{leaf}"}, evs
        assert {e["component"] for e in evs} == {f"{n}-nic{rail}"}, evs

    # One decision for the leaf: every node behind it, as one group.
    def group() -> list[dict[str, Any]]:
        return [d for d in ctl.api.decisions() if d["actor_id"] == f"correlate:{leaf}"]

    wait_until(lambda: {d["node"] for d in group()} == behind,
               lambda: f"the leaf's decision over {sorted(behind)}: {ctl.api.decisions()}")
    # The hold on the reporters' own link events ends: none becomes a decision of its own.
    log_line = re.compile(r"(\S+): link_\w+ on \S+ is covered by a correlated verdict")
    wait_until(lambda: set(reporters) <= set(log_line.findall(ctl.proc.text(200_000))),
               lambda: f"the held link events of {reporters} released as covered; decisions: {ctl.api.decisions()}")

    decisions = ctl.api.decisions()
    assert _component_groups(decisions) == {f"correlate:{leaf}"}, decisions
    assert all(d["actor_id"] == f"correlate:{leaf}" for d in decisions), "no per-node or per-NIC decision"
    assert len(decisions) == len(behind), decisions
    assert all(leaf in d["reason"] for d in decisions), decisions
    (d0,) = {tuple(d["evidence"]) for d in decisions}  # one decision: the same evidence on every node
    assert set(reporters) <= _evidence_nodes(ctl, list(d0)), (d0, reporters)
    (entry,) = [a for a in ctl.api.audit() if a["action"] == "component_fault"]
    assert entry["target"] == leaf and f"{len(behind)} node(s) as one decision" in entry["detail"], entry
    assert ctl.api.breaker()["tripped"] is False
    # The leaf is the top suspect; no NIC or cable is blamed as a shared part.
    top = max(ctl.api.verdicts(), key=lambda s: s["confidence"])
    assert (top["component"], top["kind"]) == (leaf, "leaf_switch"), ctl.api.verdicts()
    # Each node was drained once.
    drains = [e for e in fleet.sim_scheduler_effects() if e[0] == "drain"]
    assert sorted(n for _, n, _ in drains) == sorted(behind), drains


def _fleet_verdicts(ctl: Controller, *args: str) -> str:
    """``gpufleet fleet verdicts`` against the controller (a real process), its stdout."""
    out = subprocess.run(gpufleet_argv("fleet", "--url", ctl.url, "verdicts", *args),
                         env=child_env({"GPUFLEET_TOKEN": ADMIN_TOKEN, "COLUMNS": "200"}),
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def test_three_trays_short_of_a_verdict_put_the_chip_on_the_watch_list(fleet: Fleet, tmp_path: Path) -> None:
    """Below significance a weak pattern leaves a trace an operator can see: three trays, one corrected
    NVLink error each towards one chip, are no verdict (six are, above), but ``gpufleet fleet verdicts``
    lists the chip as watched, with the reporters behind it."""
    topo = TopologyFile.generate(tmp_path / "nvl72.json", "nvl72", "--racks", "1")
    trays = [c["id"] for c in topo.components("compute_tray")][:3]
    reporter = {t: f"gpu{i}" for i, t in enumerate(trays)}
    (chip,) = {_nvswitch_of(topo, f"{t}-{g}", 5) for t, g in reporter.items()}
    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path)
    for t, g in reporter.items():
        fleet.agent(t, "--gpus", "4", "--inject", f"nvlink_errors:1@{g}.nvlink5", wait=False)

    def watched() -> dict[str, Any] | None:
        doc = json.loads(_fleet_verdicts(ctl, "--json"))
        rows = [w for w in doc["watching"] if w["component"] == chip and w["witnesses"] == len(trays)]
        return {**doc, "row": rows[0]} if rows else None

    doc = wait_until(watched, lambda: f"{chip} watched; verdicts: {_fleet_verdicts(ctl, '--json')}", timeout=30)
    assert doc["suspects"] == [], doc
    assert sorted(doc["row"]["reporters"]) == sorted(f"{t}-{g}" for t, g in reporter.items()), doc
    assert 0 < doc["row"]["decades_short"] <= 2, doc
    text = _fleet_verdicts(ctl)
    assert "0 suspect(s)" in text and "watched, below significance" in text and chip in text, text
    assert "watched" not in _fleet_verdicts(ctl, "--watch", "0"), "--watch 0: no watch list"
    assert ctl.api.decisions() == [], "nothing acts on a watched pattern"


def test_one_symbol_error_per_node_on_one_rail_names_the_leaf(fleet: Fleet, tmp_path: Path) -> None:
    """The weak path on InfiniBand (issue #14): the rail-5 NIC of each of four nodes counts ONE symbol
    error, far below the agent's rate rule (10 a minute). Each agent sends a weak report (rule
    ib_symbol_error_seen, named by HCA and port); the controller names each cable and, from the four of
    them together, the leaf they share: a degrading part."""
    topo = TopologyFile.generate(tmp_path / "hgx.json", "hgx", "--nodes", "4")
    nodes = sorted(topo.racks())
    rail = 5
    cables = {n: topo.links_of(f"{n}-nic{rail}", "ib")[0] for n in nodes}
    leaves = {c["b"] if c["a"] == f"{n}-nic{rail}" else c["a"] for n, c in cables.items()}
    assert len(leaves) == 1, leaves
    (leaf,) = leaves

    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path)
    for n in nodes:
        fleet.agent(n, "--inject", f"ib_symbol:1@nic{rail}", wait=False)

    def leaf_named() -> dict[str, Any] | None:
        top = max(ctl.api.verdicts(), key=lambda s: s["confidence"], default=None)
        return top if top is not None and top["component"] == leaf else None

    top = wait_until(leaf_named, lambda: f"{leaf} named; verdicts: {ctl.api.verdicts()}", timeout=30)
    assert (top["kind"], top["finding"]) == ("leaf_switch", "degrading"), top
    assert _evidence_nodes(ctl, top["evidence"]) == set(nodes), top  # all four: fewer are not significant
    for n in nodes:
        seen = [e for e in ctl.api.events(n) if e["kind"] == "link_error"]
        assert [(e["component"], e["link"], e["attrs"]["rule"], e["severity"]) for e in seen] == [
            (f"{n}-nic{rail}", cables[n]["id"], "ib_symbol_error_seen", "info")], seen
    assert all(d["actor_id"] == f"correlate:{leaf}" for d in ctl.api.decisions()), ctl.api.decisions()


def _nvswitch_of(topo: TopologyFile, gpu: str, nvlink: int) -> str:
    """The NVSwitch chip NVLink ``nvlink`` of ``gpu`` goes to: the GPU's ``nvlink``-th (0-based) link of
    kind nvlink in topology order (docs/formats.md, "Identities")."""
    link = topo.links_of(gpu, "nvlink")[nvlink]
    far = link["b"] if link["a"] == gpu else link["a"]
    assert topo.component(far)["kind"] == "nvswitch"
    return str(far)


def test_an_nvlink_fault_seen_by_the_agents_nvlink_events_names_the_nvswitch_chip(fleet: Fleet,
                                                                                   tmp_path: Path) -> None:
    topo = TopologyFile.generate(tmp_path / "nvl72.json", "nvl72", "--racks", "1")
    trays = [c["id"] for c in topo.components("compute_tray")][:3]
    nvlink = 5
    gpus = [f"gpu{i}" for i in range(len(topo.children(trays[0], "gpu")))]
    chips = {_nvswitch_of(topo, f"{t}-{g}", nvlink) for t in trays for g in gpus}
    assert len(chips) == 1, f"NVLink {nvlink} of every GPU goes to one chip: {chips}"
    (chip,) = chips

    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path)
    for t in trays:
        injects = [a for g in gpus for a in ("--inject", f"nvlink_errors:400@{g}.nvlink{nvlink}")]
        fleet.agent(t, "--gpus", str(len(gpus)), *injects, wait=False)

    def chip_blamed() -> dict[str, Any] | None:
        """The top suspect once it is the chip, on the evidence of all three trays."""
        verdicts = ctl.api.verdicts()
        top = max(verdicts, key=lambda s: s["confidence"], default=None)
        if top is None or top["component"] != chip:
            return None
        return top if set(trays) <= _evidence_nodes(ctl, top["evidence"]) else None

    top = wait_until(chip_blamed, lambda: f"{chip} blamed by {trays}; verdicts: {ctl.api.verdicts()}", timeout=20)
    assert top["kind"] == "nvswitch", top
    # The agents' NVLink events are named with the topology's NVLink lane ids, not <gpu>~nvlink<N>.
    for t in trays:
        links = {e["link"] for e in ctl.api.events(t) if e["kind"] in ("link_error", "link_down")}
        assert links == {f"{t}-{g}~{chip}" for g in gpus}, links
    # Any decision taken is the chip's, not one per GPU or per tray.
    assert _component_groups(ctl.api.decisions()) <= {f"correlate:{chip}"}, ctl.api.decisions()
    assert all(d["actor_id"] in ("", f"correlate:{chip}") or not d["actor_id"].startswith("correlate:")
               for d in ctl.api.decisions())


def test_one_corrected_nvlink_error_per_tray_names_the_nvswitch_chip(fleet: Fleet, tmp_path: Path) -> None:
    """The weak path end to end (issue #14): six compute trays each see ONE corrected NVLink error, each on
    a link to the same chip. No link is near the agent's threshold rule (100 errors); each agent sends a
    weak report (rule nvlink_error_seen, judged info), and only the set of them, in the controller's
    coherence statistic, names the chip: a degrading part, no per-node decision."""
    topo = TopologyFile.generate(tmp_path / "nvl72.json", "nvl72", "--racks", "1")
    trays = [c["id"] for c in topo.components("compute_tray")][:6]
    nvlink = 5
    reporter = {t: f"gpu{i % 4}" for i, t in enumerate(trays)}  # a different GPU slot in each tray
    chips = {_nvswitch_of(topo, f"{t}-{g}", nvlink) for t, g in reporter.items()}
    assert len(chips) == 1, f"NVLink {nvlink} of every GPU goes to one chip: {chips}"
    (chip,) = chips

    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path)
    for t, g in reporter.items():
        fleet.agent(t, "--gpus", "4", "--inject", f"nvlink_errors:1@{g}.nvlink{nvlink}", wait=False)

    def chip_named() -> dict[str, Any] | None:
        top = max(ctl.api.verdicts(), key=lambda s: s["confidence"], default=None)
        return top if top is not None and top["component"] == chip else None

    top = wait_until(chip_named, lambda: f"{chip} named; verdicts: {ctl.api.verdicts()}", timeout=30)
    assert (top["kind"], top["finding"]) == ("nvswitch", "degrading"), top
    assert len(_evidence_nodes(ctl, top["evidence"])) >= 4, top  # several trays' reports, not one
    # Each agent's report: one error, named with the topology's lane id, judged informational. (The chip may
    # be named before the last trays' reports are in.)
    wait_until(lambda: all(ctl.api.events(t, kind="link_error") for t in trays),
               lambda: f"a link_error from each of {trays}: {ctl.api.events(kind='link_error')}")
    for t, g in reporter.items():
        seen = [e for e in ctl.api.events(t) if e["kind"] == "link_error"]
        assert [(e["link"], e["attrs"]["rule"], e["attrs"]["errors"], e["severity"]) for e in seen] == [
            (f"{t}-{g}~{chip}", "nvlink_error_seen", "1", "info")], seen
    # What acts is the chip's verdict: no decision of a node's own policy on its informational report.
    assert all(d["actor_id"] == f"correlate:{chip}" for d in ctl.api.decisions()), ctl.api.decisions()
    # The window exported as event lines replays offline to the same chip (gpufleet correlate --events).
    window = tmp_path / "window.jsonl"
    out = subprocess.run(gpufleet_argv("fleet", "--url", ctl.url, "events", "--since", "1h", "--jsonl"),
                         env=child_env({"GPUFLEET_TOKEN": ADMIN_TOKEN}), capture_output=True, text=True,
                         timeout=60, check=True)
    window.write_text(out.stdout)
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert {(ln["component"], ln["link"]) for ln in lines if ln["kind"] == "link_error"} == {
        (f"{t}-{g}", f"{t}-{g}~{chip}") for t, g in reporter.items()}, lines
    replay = subprocess.run(gpufleet_argv("correlate", "--topology", str(topo.path), "--events", str(window),
                                          "--json"), env=child_env(), capture_output=True, text=True, timeout=60,
                            check=False)
    assert replay.returncode == 1, replay.stderr  # a suspect needs action
    assert json.loads(replay.stdout)["suspects"][0]["component"] == chip, replay.stdout


def _serial_args(topo: TopologyFile, tray: str) -> list[str]:
    """Agent options that make the simulated tray report the serials ``tray`` has in the topology: the
    chassis (``--sim-serial-prefix``) and its GPUs in index order (``--sim-gpu-serials``)."""
    gpus = sorted(topo.children(tray, "gpu"), key=lambda c: _index(c["id"]))
    return ["--gpus", str(len(gpus)), "--sim-serial-prefix", topo.component(tray)["serial"],
            "--sim-gpu-serials", ",".join(c["serial"] for c in gpus)]


def _index(cid: str) -> int:
    return int(re.findall(r"\d+$", cid)[0])


def _tray_storm(topo: TopologyFile, tray: str) -> list[str]:
    """NVLink errors on a third of every GPU's links: the tray's own pattern (not one switch's)."""
    args: list[str] = []
    for gpu in sorted(topo.children(tray, "gpu"), key=lambda c: _index(c["id"])):
        for n in range(0, len(topo.links_of(gpu["id"], "nvlink")), 3):
            args += ["--inject", f"nvlink_errors:400@gpu{_index(gpu['id'])}.nvlink{n}"]
    return args


def _moves(ctl: Controller) -> list[dict[str, str]]:
    return [{k: e["attrs"].get(k, "") for k in ("serial", "from", "to")} for e in ctl.api.events(kind=MOVED)]


# Which slot's agent comes back first after the swap decides the order of the two moves the controller
# emits (the faulty tray's move first, or the healthy tray's); the verdict must not depend on it.
@pytest.mark.parametrize("first", ["new_slot_first", "old_slot_first"])
def test_a_tray_swap_seen_in_the_reported_serials_and_the_error_follows_the_tray(fleet: Fleet, tmp_path: Path,
                                                                               first: str) -> None:
    topo = TopologyFile.generate(tmp_path / "nvl72.json", "nvl72", "--racks", "1")
    a, b = "r01-ct03", "r01-ct05"
    unit_a, unit_b = topo.component(a)["serial"], topo.component(b)["serial"]
    ctl = fleet.controller(nodes=topo.racks(), topology=topo.path)

    # 1. Each tray reports its own serials; the tray in slot a has an NVLink storm: a is blamed.
    fleet.agent(b, *_serial_args(topo, b))
    fleet.agent(a, *_serial_args(topo, a), *_tray_storm(topo, a))

    def blamed(slot: str) -> dict[str, Any] | None:
        top = max(ctl.api.verdicts(), key=lambda s: s["confidence"], default=None)
        return top if top is not None and top["component"] == slot else None

    before = wait_until(lambda: blamed(a), lambda: f"{a} blamed; verdicts: {ctl.api.verdicts()}", timeout=20)
    assert (before["kind"], before["serial"]) == ("compute_tray", unit_a), before
    assert _moves(ctl) == [], "nothing moved yet"

    # 2. The trays are swapped: each slot's agent now reports the other tray's serials. The controller
    #    notices and emits the moves itself.
    fleet.stop_agent(a)
    fleet.stop_agent(b)
    expected = {a: {"serial": unit_b, "from": b, "to": a}, b: {"serial": unit_a, "from": a, "to": b}}
    for slot in (b, a) if first == "new_slot_first" else (a, b):
        before_moves = len(_moves(ctl))
        fleet.agent(slot, *_serial_args(topo, b if slot == a else a))
        wait_until(lambda: len(_moves(ctl)) > before_moves, f"the move into {slot}")  # noqa: B023 (called here)
        assert _moves(ctl)[0] == expected[slot], _moves(ctl)  # newest first

    # 3. The faulty tray, now in slot b, storms again: the verdict follows the unit to b, by its serial.
    fleet.stop_agent(b)
    fleet.agent(b, *_serial_args(topo, a), *_tray_storm(topo, b))
    follows = f"followed unit {unit_a} from {a} to {b}"
    moved = wait_until(lambda: (v := blamed(b)) is not None and follows in v["reason"] and v,
                       lambda: f"{b} blamed, following {unit_a}; verdicts: {ctl.api.verdicts()}", timeout=20)
    assert (moved["kind"], moved["serial"]) == ("compute_tray", unit_a), moved
    assert len(_moves(ctl)) == 2, f"a restart with the same serials moves nothing: {_moves(ctl)}"


# ---- nobody writes a move by hand ------------------------------------------------------------------
# Unit tests of the pure correlator and of the events-file format feed moves on purpose: that is what
# they test. Everything that drives the controller, its store or the agents must get its moves from the
# controller (reported serials). Reading moves back (``events(kind="moved")``, expected values) is fine.
_SCANNED = ("tests/e2e", "tests/integration", "tests/contract", "tests/fixtures", "bench", "scripts")
# Calls that hand events to something: HTTP bodies, the controller's or the store's ingest, an events file.
_WRITERS = frozenset({"post", "put", "patch", "request", "ingest", "ingest_many", "submit", "post_event",
                      "observe", "observe_health_event", "append", "add", "write", "write_text", "dumps", "dump",
                      "writelines", "save"})
_KIND = "moved"


def _is_move(node: ast.AST) -> bool:
    """``EventKind.MOVED`` / ``E.MOVED``, a ``"kind": "moved"`` entry, or ``kind="moved"``."""
    if isinstance(node, ast.Attribute) and node.attr == _KIND.upper():
        return True
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "kind" and isinstance(v, ast.Constant)
                   and v.value == _KIND for k, v in zip(node.keys, node.values, strict=True))
    if isinstance(node, ast.keyword):
        return node.arg == "kind" and ((isinstance(node.value, ast.Constant) and node.value.value == _KIND)
                                       or _is_move(node.value))
    return False


def _moves_written(tree: ast.AST) -> list[int]:
    """Lines where a move is built as an event (``HealthEvent(..., EventKind.MOVED)``) or handed to a writer."""
    lines: list[int] = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if not (name.endswith("HealthEvent") or name in _WRITERS):
            continue
        inside = [n for part in (*call.args, *call.keywords) for n in ast.walk(part)]
        if any(_is_move(n) for n in inside):
            lines.append(call.lineno)
    return sorted(set(lines))


def _scan(repo: Path) -> list[str]:
    found: list[str] = []
    pattern = re.compile(r'"kind"\s*:\s*"' + _KIND + '"')
    for top in _SCANNED:
        for path in sorted((repo / top).rglob("*")):
            if not path.is_file():
                continue
            where = path.relative_to(repo)
            if path.suffix == ".py":
                found += [f"{where}:{n}" for n in _moves_written(ast.parse(path.read_text(), str(path)))]
            elif path.suffix in (".json", ".jsonl", ".ndjson"):
                text = path.read_text(errors="replace")
                found += [f"{where}:{text.count(chr(10), 0, m.start()) + 1}" for m in pattern.finditer(text)]
    return found


def test_no_test_or_fixture_writes_a_moved_event_by_hand(tmp_path: Path) -> None:
    offenders = _scan(REPO)
    assert offenders == [], "moved events must come from the controller (reported serials):\n" + "\n".join(offenders)
    # The scan finds the shapes a hand-written move would take (so an empty result means something).
    sample = tmp_path / "tests" / "e2e" / "sample.py"
    sample.parent.mkdir(parents=True)
    sample.write_text(
        "api.post('/events', json={'events': [{'kind': '" + _KIND + "', 'serial': 'S', 'from': 'a', 'to': 'b'}]})\n"
        "c.ingest([HealthEvent('m', 'n', EventKind." + _KIND.upper() + ", T0)])\n"
        "ev = HealthEvent(id='m', node='n', kind=E." + _KIND.upper() + ", time=T0)\n"
        "api.get('/events', params={'kind': '" + _KIND + "'})\n"  # reading: not a write
        "assert [e['kind'] for e in got] == ['" + _KIND + "']\n")
    (tmp_path / "tests" / "fixtures").mkdir()
    (tmp_path / "tests" / "fixtures" / "ev.jsonl").write_text('{"kind": "' + _KIND + '", "serial": "S"}\n')
    assert _scan(tmp_path) == ["tests/e2e/sample.py:1", "tests/e2e/sample.py:2", "tests/e2e/sample.py:3",
                               "tests/fixtures/ev.jsonl:1"]
