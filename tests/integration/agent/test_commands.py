"""The agent command channel against the real controller (FastAPI + SQLite): the agent's poller
fetches its node's repair commands with its own token, runs them on a simulated device, reports; the
journal makes every command run at most once across agent restarts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.commands import CommandPoller, HostRepairs, SimRepairs
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.controller.runtime import Runtime, build
from gpufleet.controller.settings import ControllerSettings, Role, SchedulerKind, TokenConfig
from gpufleet.controller.store.repairs import RepairStore
from gpufleet.domain.fleet import Fleet, Node
from gpufleet.lifecycle.repair import RepairStep
from gpufleet.schedulers.sim import SimScheduler

NODE, OTHER = "r01-n001", "r01-n002"
TOKEN = "agent-token-r01-n001-0123456789"
OTHER_TOKEN = "agent-token-r01-n002-0123456789"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[tuple[Runtime, str]]:
    settings = ControllerSettings(
        database_url=f"sqlite:///{tmp_path / 'c.db'}", host="127.0.0.1", port=0, scheduler=SchedulerKind.SIM,
        tokens=(TokenConfig(name="a1", role=Role.AGENT, token=TOKEN, nodes=(NODE,)),
                TokenConfig(name="a2", role=Role.AGENT, token=OTHER_TOKEN, nodes=(OTHER,))))
    rt = build(settings, SimScheduler([NODE, OTHER]))
    rt.controller.register_fleet(Fleet.of([Node(id=NODE, rack="r01"), Node(id=OTHER, rack="r01")]))
    ports: list[int] = []
    rt.start_api(on_started=ports.append)
    yield rt, f"http://127.0.0.1:{ports[0]}"
    rt.shutdown()


def _poller(url: str, device: SimDevice, journal: Path, boot: list[str], token: str = TOKEN) -> CommandPoller:
    return CommandPoller(url, token, NODE, SimRepairs(device), journal, boot_id=lambda: boot[0])


def _status(rt: Runtime, key: str) -> str:
    cmd = RepairStore(rt.controller.store).command(key)
    assert cmd is not None
    return cmd.status


def test_a_queued_gpu_reset_runs_once_on_the_sim_device_and_clears_its_fault(
        controller: tuple[Runtime, str], tmp_path: Path) -> None:
    rt, url = controller
    repairs = RepairStore(rt.controller.store)
    device = SimDevice(4)
    device.open()
    device.fall_off_bus(2)
    assert device.read_fast(2).lost
    repairs.enqueue("d-1:repair:1:gpu_reset", NODE, RepairStep.GPU_RESET, datetime.now(UTC))
    boot = ["boot-a"]
    poller = _poller(url, device, tmp_path / "commands.json", boot)
    assert poller.poll_once() == ["d-1:repair:1:gpu_reset"]
    assert not device.read_fast(2).lost, "the simulated reset cleared the injected fault"
    assert _status(rt, "d-1:repair:1:gpu_reset") == "succeeded"
    cmd = repairs.command("d-1:repair:1:gpu_reset")
    assert cmd is not None and "1 GPU(s) had a fault cleared" in cmd.detail
    assert poller.poll_once() == []  # nothing queued any more
    poller.close()


def test_an_interrupted_reboot_counts_as_done_only_if_the_host_rebooted(
        controller: tuple[Runtime, str], tmp_path: Path) -> None:
    rt, url = controller
    repairs = RepairStore(rt.controller.store)
    now = datetime.now(UTC)
    repairs.enqueue("k-reboot", NODE, RepairStep.REBOOT, now)
    repairs.enqueue("k-reset", NODE, RepairStep.GPU_RESET, now)
    journal = tmp_path / "commands.json"
    # What an agent left behind when it died mid-command: started, no result.
    journal.write_text(json.dumps({"k-reboot": {"kind": "reboot", "boot_id": "boot-a"},
                                   "k-reset": {"kind": "gpu_reset", "boot_id": "boot-a"}}))
    device = SimDevice(2)
    device.open()
    device.fall_off_bus(0)
    poller = _poller(url, device, journal, ["boot-b"])  # the host came back with a new boot id
    assert sorted(poller.poll_once()) == ["k-reboot", "k-reset"]
    assert _status(rt, "k-reboot") == "succeeded" and _status(rt, "k-reset") == "failed"
    assert device.read_fast(0).lost, "an interrupted command is never run again"
    poller.close()


def test_commands_are_node_restricted_and_an_expired_command_is_dropped(
        controller: tuple[Runtime, str], tmp_path: Path) -> None:
    rt, url = controller
    repairs = RepairStore(rt.controller.store)
    repairs.enqueue("k-1", NODE, RepairStep.GPU_RESET, datetime.now(UTC))
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {OTHER_TOKEN}"}) as other:
        r = other.get(f"/nodes/{NODE}/commands")
        assert r.status_code == 403 and OTHER_TOKEN not in r.text
        assert other.post(f"/nodes/{NODE}/commands/k-1/result", json={"ok": True}).status_code == 403
        assert other.get(f"/nodes/{OTHER}/commands").json() == {"commands": []}
        r = other.post(f"/nodes/{OTHER}/commands/k-1/result", json={"ok": True})
        assert r.status_code == 404  # a command of another node is not found for this one
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}) as mine:
        r = mine.post(f"/nodes/{NODE}/commands/k-1/result", json={"ok": "maybe"})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "ok"
    repairs.expire("k-1", datetime.now(UTC))
    device = SimDevice(1)
    device.open()
    poller = _poller(url, device, tmp_path / "j.json", ["b"])
    assert poller.poll_once() == []  # expired: not offered any more
    repairs.enqueue("k-2", NODE, RepairStep.REBOOT, datetime.now(UTC))
    repairs.expire("k-2", datetime.now(UTC))
    with httpx.Client(base_url=url + "/v1", headers={"Authorization": f"Bearer {TOKEN}"}) as mine:
        r = mine.post(f"/nodes/{NODE}/commands/k-2/result", json={"ok": True, "detail": "late"})
        assert r.status_code == 409 and "expired" in r.text
    poller.close()


def _fake_smi(tmp_path: Path, apps: str) -> str:
    """A stand-in ``nvidia-smi`` (a real executable): lists ``apps`` as compute processes; ``-r``
    succeeds and leaves a mark."""
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!{sys.executable}\nimport sys, pathlib\n"
                    f"if sys.argv[1] == '-r':\n    pathlib.Path({str(tmp_path / 'reset-done')!r}).touch()\n"
                    "    print('GPU 00000000:2A:00.0 was successfully reset.')\n"
                    f"else:\n    print({apps!r}, end='')\n")
    path.chmod(0o755)
    return str(path)


def test_host_gpu_reset_is_refused_while_a_process_holds_a_gpu(tmp_path: Path) -> None:
    busy = HostRepairs(["true"], ["true"], nvidia_smi=_fake_smi(tmp_path, "4242, 00000000:2A:00.0\n"))
    out = busy.run("gpu_reset")
    assert not out.ok and "1 process(es) hold a GPU (4242, 00000000:2A:00.0)" in out.detail
    assert not (tmp_path / "reset-done").exists()
    idle = HostRepairs(["true"], ["false"], nvidia_smi=_fake_smi(tmp_path, ""))
    out = idle.run("gpu_reset")
    assert out.ok and "successfully reset" in out.detail and (tmp_path / "reset-done").exists()
    assert idle.run("reboot").ok and not idle.run("restart_fabric_manager").ok


def test_a_host_reboot_is_reported_when_the_host_is_back_or_failed_when_it_never_went_down(
        controller: tuple[Runtime, str], tmp_path: Path) -> None:
    """``systemctl reboot`` exits 0 once the reboot is scheduled: the result waits for a new boot id."""
    rt, url = controller
    repairs = RepairStore(rt.controller.store)
    now = datetime.now(UTC)
    repairs.enqueue("k-back", NODE, RepairStep.REBOOT, now)
    repairs.enqueue("k-stuck", NODE, RepairStep.REBOOT, now)
    boot, clock = ["boot-a"], [1000.0]
    host = HostRepairs(["true"], ["true"], nvidia_smi=_fake_smi(tmp_path, ""))

    def poll() -> list[str]:  # a new agent process each time, on the same journal
        p = CommandPoller(url, TOKEN, NODE, host, tmp_path / "commands.json", boot_id=lambda: boot[0],
                          reboot_wait_s=600, clock=lambda: clock[0])
        try:
            return p.poll_once()
        finally:
            p.close()

    assert poll() == []  # both reboot commands ran (exit 0): nothing reported yet
    assert _status(rt, "k-back") == _status(rt, "k-stuck") == "queued"
    clock[0] += 599
    assert poll() == []  # still within the wait, same boot: still nothing
    journal = json.loads((tmp_path / "commands.json").read_text())
    assert set(journal) == {"k-back", "k-stuck"} and all("ok" not in e for e in journal.values())

    boot[0] = "boot-b"  # the host went down and came back: both are done
    assert sorted(poll()) == ["k-back", "k-stuck"]
    assert _status(rt, "k-back") == "succeeded"

    repairs.enqueue("k-never", NODE, RepairStep.REBOOT, now)
    assert poll() == []
    clock[0] += 600  # the wait is over and the boot id never changed
    assert poll() == ["k-never"]
    cmd = repairs.command("k-never")
    assert cmd is not None and cmd.status == "failed" and "did not reboot within 600 s" in cmd.detail
