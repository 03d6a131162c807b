"""Crash safety of a maintenance rollout on the real Slurm lab: a real ``gpufleet controller serve`` is
killed with SIGKILL while a node's maintenance script runs (the agent has it, its result is not in), and
again while the next node is being revalidated; each time the restarted controller resumes the rollout
from the store: no script runs twice, no second validation job, every node returns.

(The rollout's other behaviour on the lab: tests/integration/slurm/test_maintenance_real.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import AGENT_TOKEN, Controller, Fleet, wait_until
from tests.integration.slurm.lab import SlurmLab
from tests.integration.slurm.test_loop import _verdict_script
from tests.integration.slurm.test_maintenance_real import script_config

pytestmark = [pytest.mark.e2e, pytest.mark.slurm, pytest.mark.fleetops]


def _status(ctl: Controller, rid: str) -> dict[str, Any]:
    out: dict[str, Any] = ctl.api.get(f"/maintenance/{rid}")
    return out


def _steps(ctl: Controller, rid: str) -> dict[str, str]:
    return {n["node"]: n["step"] for n in _status(ctl, rid)["nodes"]}


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_sigkill_mid_rollout_resumes_and_runs_nothing_twice(fleet: Fleet, slurm_lab: SlurmLab,
                                                            tmp_path: Path) -> None:
    lab = slurm_lab
    url_file, verdict = _verdict_script(tmp_path, AGENT_TOKEN)
    command = (tmp_path / "command").read_text()
    validation = (f"[validation]\ncommand = {command!r}\nuser = \"root\"\ntime_limit = \"5m\"\n"
                  f"output = \"{lab.root / 'jobs' / 'validate-%j.out'}\"")
    ctl = fleet.controller(nodes=["n1", "n2"], scheduler="slurm", slurm_conf=lab.slurm_conf, extra_config=validation)
    url_file.write_text(ctl.url)
    runs, go = tmp_path / "runs", tmp_path / "go"
    for n in ("n1", "n2"):
        fleet.agent(n, config="command_poll_s = 0.3\n" + script_config(runs, gate=go))
    rid = ctl.api.post("/maintenance", {"selector": "nodes:n1,n2", "action": "script:update"})["id"]
    ctl.api.post(f"/maintenance/{rid}/start", {})

    wait_until(lambda: _lines(runs) == ["n1"], lambda: f"n1's script running: {_status(ctl, rid)}", 60)
    fleet.kill_controller()  # the agent runs the script; the controller waits for its result
    fleet.restart_controller()
    verdict.write_text("pass")  # the validation jobs' check passes from now on
    go.touch()  # the script ends; the agent posts its result to the restarted controller
    wait_until(lambda: _steps(ctl, rid)["n2"] == "validating", lambda: f"n2 validating: {_status(ctl, rid)}", 90)
    fleet.kill_controller()  # n2's action done; its validation job submitted (or about to be)
    fleet.restart_controller()

    done = wait_until(lambda: (s := _status(ctl, rid))["state"] == "done" and s,
                      lambda: f"rollout done: {_status(ctl, rid)}", 90)
    assert {n["node"]: n["step"] for n in done["nodes"]} == {"n1": "done", "n2": "done"}
    assert sorted(_lines(runs)) == ["n1", "n2"], f"each script ran once: {_lines(runs)}"
    for n in ("n1", "n2"):
        audit = ctl.api.get("/audit", target=n)
        assert [a["action"] for a in audit].count("maintenance_action") == 1, n
        assert [a["action"] for a in audit].count("validation_job") == 1, (n, audit)
        results = [a for a in audit if a["action"] == "command_result"]
        assert len(results) == 1 and "succeeded" in results[0]["detail"], results
        wait_until(lambda n=n: "DRAIN" not in lab.scontrol_show_node(n).split("State=", 1)[1].split()[0],
                   f"{n} resumed in Slurm", 30)
