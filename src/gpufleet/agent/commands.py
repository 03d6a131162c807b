"""Repair commands from the controller: the agent's side of the command channel (docs/agent.md).

The poller asks ``GET /v1/nodes/{node}/commands`` with the node's token every ``command_poll_s``, runs
each queued command and posts ``POST /v1/nodes/{node}/commands/{id}/result`` ``{"ok", "detail"}``.

* **At most once.** Before it runs a command the agent writes the command's id, kind and the host's
  boot id to a journal (``<state_dir>/commands.json``, atomic); after, the result. Polled again (a
  lost answer, an agent restart) a finished command's stored result is posted again, never the
  command re-run. A command found started but unfinished was interrupted: a ``reboot`` whose boot id
  has changed since succeeded (the host did reboot); anything else is reported failed.
* **A reboot succeeds when the host is back.** ``systemctl reboot`` (like most reboot hooks) exits 0 as
  soon as the reboot is *scheduled*; reporting success then would let the controller revalidate a host
  that is about to go down. So a host reboot whose command exited 0 is journalled as awaiting the reboot
  and nothing is posted: the agent that starts after the reboot sees a new boot id and reports success.
  If the boot id has not changed ``reboot_wait_s`` after the command (default 15 min, below the
  controller's 30-min step timeout), the reboot is reported failed. (A simulated node's reboot is done
  when its reset returns.)
* **Commands.** ``gpu_reset``: on a real node ``nvidia-smi -r``, refused while any process holds a
  GPU (``nvidia-smi --query-compute-apps``); on a simulated node the device's own reset, which clears
  its injected faults. ``reboot``: the configured ``reboot_command`` (default ``systemctl reboot``;
  the simulated node simulates one). ``restart_fabric_manager``: ``fabric_manager_command`` (default
  ``systemctl restart nvidia-fabricmanager``). ``diagnostic_bundle``: what a vendor RMA asks for
  (``agent.bundle``), saved under ``<state_dir>/bundles/`` and uploaded with
  ``PUT /v1/nodes/{node}/commands/{id}/bundle`` before the result is posted (again after a restart,
  from the saved file: captured once, uploaded until the controller has it). ``script:<name>``: a
  maintenance script this agent's config names (agent.maintenance; a rollout's action).
* A 409 answer (the controller gave up waiting: the command expired) drops the command; any other
  failure to post keeps the result for the next poll.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from gpufleet.agent import bundle as bundles
from gpufleet.agent.config import AgentConfig
from gpufleet.agent.devices.port import Device
from gpufleet.agent.devices.sim import SimDevice
from gpufleet.lifecycle.maintenance import SCRIPT_PREFIX

log = logging.getLogger(__name__)
_KEEP = 200  # journal entries kept (the newest)
BUNDLE = "diagnostic_bundle"


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    detail: str
    awaits_reboot: bool = False  # the command only scheduled a reboot: done when the boot id changes


class NodeRepairs(Protocol):
    """What a node can do to repair itself. Never raises: a failure is an Outcome with ok=False."""

    def run(self, kind: str) -> Outcome: ...


Run = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


class HostRepairs:
    """A real node: ``nvidia-smi``, the configured reboot and fabric-manager commands."""

    def __init__(self, reboot_command: Sequence[str], fabric_manager_command: Sequence[str], *,
                 nvidia_smi: str = "nvidia-smi", run: Run = _run, timeout: float = 300.0) -> None:
        self.reboot_command, self.fm_command = list(reboot_command), list(fabric_manager_command)
        self.smi, self._run, self.timeout = nvidia_smi, run, timeout

    def run(self, kind: str) -> Outcome:
        try:
            if kind == "gpu_reset":
                return self._gpu_reset()
            if kind == "reboot":
                out = self._command(self.reboot_command, "reboot")
                return Outcome(True, out.detail, awaits_reboot=True) if out.ok else out
            if kind == "restart_fabric_manager":
                return self._command(self.fm_command, "fabric manager restart")
        except (OSError, subprocess.SubprocessError) as err:
            return Outcome(False, f"{kind}: {err}")
        return Outcome(False, f"unknown command {kind!r}")

    def _gpu_reset(self) -> Outcome:
        apps = self._run([self.smi, "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"], 60)
        if apps.returncode != 0:
            return Outcome(False, f"refused: cannot list GPU processes ({_last(apps)})")
        busy = [ln.strip() for ln in apps.stdout.splitlines() if ln.strip()]
        if busy:
            return Outcome(False, f"refused: {len(busy)} process(es) hold a GPU ({'; '.join(busy[:4])})")
        res = self._run([self.smi, "-r"], self.timeout)
        return Outcome(res.returncode == 0, f"nvidia-smi -r: {_last(res) or f'exit {res.returncode}'}")

    def _command(self, argv: list[str], what: str) -> Outcome:
        res = self._run(argv, self.timeout)
        return Outcome(res.returncode == 0, f"{what} ({' '.join(argv)}): {_last(res) or f'exit {res.returncode}'}")


class SimRepairs:
    """A simulated node: the simulated device resets (clearing its injected faults); a reboot is
    simulated the same way; the fabric manager restart always works."""

    def __init__(self, device: SimDevice) -> None:
        self.device = device

    def run(self, kind: str) -> Outcome:
        if kind in ("gpu_reset", "reboot"):
            cleared = self.device.reset()
            what = "simulated GPU reset" if kind == "gpu_reset" else "simulated reboot"
            return Outcome(True, f"{what}: {len(cleared)} GPU(s) had a fault cleared")
        if kind == "restart_fabric_manager":
            return Outcome(True, "simulated fabric manager restart")
        return Outcome(False, f"unknown command {kind!r}")


class CommandPoller:
    def __init__(self, controller: str, token: str, node: str, repairs: NodeRepairs, journal: Path, *,
                 boot_id: Callable[[], str], on_repaired: Callable[[str], None] | None = None,
                 interval: float = 10.0, client: httpx.Client | None = None,
                 bundler: Callable[[], dict[str, Any]] | None = None,
                 verify: ssl.SSLContext | bool = True, reboot_wait_s: float = 900.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.node, self.repairs, self.journal = node, repairs, journal
        self.reboot_wait_s, self.clock = reboot_wait_s, clock
        self.bundler = bundler
        self.boot_id, self.on_repaired, self.interval = boot_id, on_repaired, interval
        self._http = client or httpx.Client(base_url=controller.rstrip("/") + "/v1", timeout=30.0, verify=verify,
                                            headers={"Authorization": f"Bearer {token}"})

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # never let the poller die: the next poll tries again
                log.exception("%s: polling repair commands failed", self.node)
            stop.wait(self.interval)

    def poll_once(self) -> list[str]:
        """Fetch, run and answer the queued commands; returns the ids answered."""
        try:
            r = self._http.get(f"/nodes/{self.node}/commands")
        except httpx.HTTPError as err:
            log.warning("%s: controller unreachable for commands: %s", self.node, err)
            return []
        if r.status_code != 200:
            log.warning("%s: GET commands answered %d: %s", self.node, r.status_code, r.text[:200])
            return []
        answered = []
        for cmd in r.json().get("commands", []):
            entry = self._entry(str(cmd["id"]), str(cmd["kind"]))
            if entry is not None and self._post(str(cmd["id"]), entry):
                answered.append(str(cmd["id"]))
        return answered

    def close(self) -> None:
        self._http.close()

    def _entry(self, cid: str, kind: str) -> dict[str, Any] | None:
        """The command's result to post, running it first if it never ran; None while a host reboot the
        command scheduled has not happened yet (nothing to post)."""
        book = self._load()
        entry = book.get(cid)
        if entry is not None and "ok" in entry:
            return entry  # ran before: report the same result again
        if entry is not None:  # started, never finished: the agent (or the host) went down meanwhile
            rebooted = entry.get("boot_id") != self.boot_id()
            since = entry.get("awaiting_reboot_since")
            if since is not None and not rebooted:
                if self.clock() - float(since) < self.reboot_wait_s:
                    return None  # the reboot is scheduled; the host has not gone down yet
                entry.update(ok=False, detail=f"the reboot command exited 0 ({entry.get('command_detail', '')}) "
                                              f"but the host did not reboot within {self.reboot_wait_s:.0f} s "
                                              "(boot id unchanged)")
            else:
                ok = kind == "reboot" and rebooted
                detail = ("host rebooted (boot id changed)" if ok
                          else "interrupted: the agent restarted while running it")
                entry.update(ok=ok, detail=detail)
        else:
            entry = {"kind": kind, "boot_id": self.boot_id()}
            book[cid] = entry
            self._save(book)  # written before the command runs: never run twice
            log.info("%s: running repair command %s (%s)", self.node, kind, cid)
            out = self._bundle(cid) if kind == BUNDLE else self.repairs.run(kind)
            if out.awaits_reboot:
                entry.update(awaiting_reboot_since=self.clock(), command_detail=out.detail)
                book[cid] = entry
                self._save(book)
                log.info("%s: reboot (%s) scheduled: %s; its result is posted once the host is back",
                         self.node, cid, out.detail)
                return None
            entry.update(ok=out.ok, detail=out.detail)
            log.log(logging.INFO if out.ok else logging.WARNING, "%s: %s %s: %s", self.node, kind,
                    "succeeded" if out.ok else "failed", out.detail)
        book[cid] = entry
        self._save(book)
        if entry["ok"] and self.on_repaired is not None and kind != BUNDLE and not kind.startswith(SCRIPT_PREFIX):
            self.on_repaired(kind)
        return entry

    def _bundle_path(self, cid: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in cid)
        return self.journal.parent / "bundles" / f"{safe}.json"

    def _bundle(self, cid: str) -> Outcome:
        if self.bundler is None:
            return Outcome(False, "this agent cannot capture diagnostic bundles")
        doc = self.bundler()
        path = self._bundle_path(cid)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        tmp.replace(path)
        return Outcome(True, f"bundle captured: {bundles.summary(doc)}")

    def _upload(self, cid: str, entry: dict[str, Any]) -> bool:
        """Upload a captured bundle (True when the controller has it, or there is none to send)."""
        path = self._bundle_path(cid)
        if entry.get("kind") != BUNDLE or not entry.get("ok") or entry.get("uploaded") or not path.exists():
            return True
        try:
            r = self._http.put(f"/nodes/{self.node}/commands/{cid}/bundle", content=path.read_bytes(),
                               headers={"Content-Type": "application/json"})
        except httpx.HTTPError as err:
            log.warning("%s: could not upload bundle %s (%s); will try again", self.node, cid, err)
            return False
        if r.status_code not in (200, 201, 409):
            log.warning("%s: bundle upload %s answered %d: %s", self.node, cid, r.status_code, r.text[:200])
            return r.status_code in {404, 413}  # nobody will take it: report anyway
        book = self._load()
        if cid in book:
            book[cid]["uploaded"] = True
            self._save(book)
        return True

    def _post(self, cid: str, entry: dict[str, Any]) -> bool:
        if not self._upload(cid, entry):
            return False
        body = {"ok": bool(entry["ok"]), "detail": str(entry["detail"])[:2000]}
        try:
            r = self._http.post(f"/nodes/{self.node}/commands/{cid}/result", json=body)
        except httpx.HTTPError as err:
            log.warning("%s: could not report command %s (%s); will report it again", self.node, cid, err)
            return False
        if r.status_code == 409:
            log.warning("%s: controller no longer waits for command %s: %s", self.node, cid, r.text[:200])
            return True
        if r.status_code != 200:
            log.warning("%s: reporting command %s answered %d; will report it again", self.node, cid, r.status_code)
            return False
        return True

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads(self.journal.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError:
            log.error("%s: command journal %s is corrupt; starting a new one", self.node, self.journal)
            return {}
        return doc if isinstance(doc, dict) else {}

    def _save(self, book: dict[str, dict[str, Any]]) -> None:
        keep = dict(list(book.items())[-_KEEP:])
        tmp = self.journal.with_name(f".{self.journal.name}.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(keep, fh)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.journal)


def start_poller(cfg: AgentConfig, token: str, device: Device, stop: threading.Event,
                 on_repaired: Callable[[str], None] | None = None,
                 verify: ssl.SSLContext | bool = True) -> threading.Thread | None:
    """Poll for repair commands in a thread (``commands`` on and pushing to a controller)."""
    if not (cfg.commands and cfg.push and cfg.controller):
        return None
    from gpufleet.agent.maintenance import MaintenanceScripts

    repairs: NodeRepairs = (SimRepairs(device) if isinstance(device, SimDevice)
                            else HostRepairs(cfg.reboot_command, cfg.fabric_manager_command))
    repairs = MaintenanceScripts(repairs, cfg.maintenance_scripts, cfg.node, timeout=cfg.maintenance_timeout_s)
    poller = CommandPoller(cfg.controller, token, cfg.node, repairs, cfg.state_dir / "commands.json",
                           boot_id=boot_id_reader(cfg.proc_root), on_repaired=on_repaired,
                           interval=cfg.command_poll_s, bundler=lambda: bundles.collect(cfg, device),
                           verify=verify, reboot_wait_s=cfg.reboot_wait_s)

    def loop() -> None:
        try:
            poller.run(stop)
        finally:
            poller.close()

    t = threading.Thread(target=loop, name="gpufleet-commands", daemon=True)
    t.start()
    return t


def boot_id_reader(proc_root: Path) -> Callable[[], str]:
    """The kernel's boot id (changes at every boot); "" where it cannot be read."""
    path = proc_root / "sys" / "kernel" / "random" / "boot_id"

    def read() -> str:
        try:
            return path.read_text().strip()
        except OSError:
            return ""

    return read


def _last(res: subprocess.CompletedProcess[str]) -> str:
    for text in (res.stderr, res.stdout):
        lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
        if lines:
            return lines[-1]
    return ""
