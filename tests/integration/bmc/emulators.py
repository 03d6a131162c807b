"""Real Redfish services for the BMC tests, both from OpenStack's sushy-tools, started as processes on
free ports and stopped by PID:

* :func:`start_emulator`: ``sushy-emulator --fake`` (the fake systems driver: no libvirt) with HTTP Basic
  authentication from an htpasswd file (bcrypt) — power actions (applied 1 to 11 s later, as on real
  hardware), boot override, managers. It has no ``LogServices`` and no ``FirmwareInventory``.
* :class:`Mockup` + :func:`start_static`: ``sushy-static`` serving a Redfish mockup tree (the DMTF mockup
  layout: one ``index.json`` per resource) that the test writes — a system with a SEL ``LogService``
  and entries, a manager, an ``UpdateService/FirmwareInventory`` with GPUs. Files are read on every
  request, so a test adds SEL entries while the service runs.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import require_service
from tests.e2e.harness import wait_until

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Service:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _tool(name: str) -> str:
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    require_service(found is not None, f"{name} (pip install sushy-tools: the dev extra)")
    assert found is not None
    return found


def _spawn(argv: list[str], log: Path, url: str, auth: tuple[str, str] | None,
           verify: str | bool = True) -> Service:
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    svc = Service(url, proc, log)

    def up() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return httpx.get(f"{url}/redfish/v1/", auth=auth, timeout=2, verify=verify).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, lambda: f"{argv[0]} answering at {url}; log:\n{log.read_text(errors='replace')[-3000:]}", 30)
    assert proc.poll() is None, f"{argv[0]} exited {proc.returncode}:\n{svc.text()[-3000:]}"
    return svc


def make_ca(root: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for ``host`` (the openssl command line): (ca.crt, crt, key)."""
    require_service(shutil.which("openssl") is not None, "the openssl command")
    root.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=bmc-test-ca",
            "-keyout", "ca.key", "-out", "ca.crt")
    (root / "san.ext").write_text(f"subjectAltName=IP:{host}\n", encoding="utf-8")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}", "-keyout", "bmc.key", "-out", "bmc.csr")
    openssl("x509", "-req", "-in", "bmc.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-out", "bmc.crt", "-extfile", "san.ext")
    return root / "ca.crt", root / "bmc.crt", root / "bmc.key"


def start_emulator(root: Path, systems: dict[str, str], user: str, password: str, *,
                   tls: tuple[Path, Path, Path] | None = None) -> Service:
    """``sushy-emulator --fake`` with one fake system per ``name -> uuid``, all powered On; over HTTPS with
    ``tls`` = (CA, certificate, key) from :func:`make_ca`."""
    import bcrypt

    root.mkdir(parents=True, exist_ok=True)
    (root / "htpasswd").write_text(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()}\n")
    fakes = [{"uuid": u, "name": n, "power_state": "On", "external_notifier": False, "nics": []}
             for n, u in systems.items()]
    (root / "emulator.conf").write_text(
        f"SUSHY_EMULATOR_AUTH_FILE = {str(root / 'htpasswd')!r}\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fakes!r}\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(root / 'state')!r}\n")
    port = free_port()
    _tool("sushy-emulator")
    # The emulator's own entry point, with its log at INFO (it logs every power action it applies:
    # 'System "<uuid>" power state set to "ForceOff"'), which its CLI leaves at WARNING.
    boot = ("import logging, sys; logging.basicConfig(level=logging.INFO); "
            "from sushy_tools.emulator.main import main; sys.argv[0] = 'sushy-emulator'; sys.exit(main())")
    argv = [sys.executable, "-c", boot, "--config", str(root / "emulator.conf"), "--fake", "-i", "127.0.0.1",
            "-p", str(port)]
    if tls is not None:
        argv += ["--ssl-certificate", str(tls[1]), "--ssl-key", str(tls[2])]
        return _spawn(argv, root / "emulator.log", f"https://127.0.0.1:{port}", (user, password), str(tls[0]))
    return _spawn(argv, root / "emulator.log", f"http://127.0.0.1:{port}", (user, password))


def start_static(mockup: Path, log: Path) -> Service:
    port = free_port()
    argv = [_tool("sushy-static"), "-i", "127.0.0.1", "-p", str(port), "-m", str(mockup)]
    return _spawn(argv, log, f"http://127.0.0.1:{port}", None)


class Mockup:
    """A Redfish mockup tree: service root, one system with a SEL, one manager, firmware inventory."""

    def __init__(self, root: Path, *, bmc_version: str = "2.10.4", bios: str = "1.7.3",
                 gpu_versions: tuple[str, ...] = ("96.00.89.00.01",) * 2) -> None:
        self.root = root
        self.entries: list[str] = []
        sys_, mgr = "/redfish/v1/Systems/1", "/redfish/v1/Managers/BMC"
        self._put("", {"@odata.id": "/redfish/v1/", "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
                       "Id": "RootService", "Name": "Root Service", "RedfishVersion": "1.15.0",
                       "UUID": "92384634-2938-2342-8820-489239905423",
                       "Systems": {"@odata.id": "/redfish/v1/Systems"},
                       "Managers": {"@odata.id": "/redfish/v1/Managers"},
                       "UpdateService": {"@odata.id": "/redfish/v1/UpdateService"}})
        self._put("Systems", _coll("/redfish/v1/Systems", [sys_]))
        self._put("Systems/1", {
            "@odata.id": sys_, "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "Id": "1", "Name": "node",
            "PowerState": "On", "BiosVersion": bios,
            "Boot": {"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None",
                     "BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Hdd"]},
            "LogServices": {"@odata.id": f"{sys_}/LogServices"},
            "Links": {"ManagedBy": [{"@odata.id": mgr}]},
            "Actions": {"#ComputerSystem.Reset": {"target": f"{sys_}/Actions/ComputerSystem.Reset",
                                                  "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]}}})
        self._put("Systems/1/LogServices", _coll(f"{sys_}/LogServices", [f"{sys_}/LogServices/SEL"]))
        self._put("Systems/1/LogServices/SEL", {
            "@odata.id": f"{sys_}/LogServices/SEL", "@odata.type": "#LogService.v1_3_0.LogService", "Id": "SEL",
            "Name": "System Event Log", "LogEntryType": "SEL",
            "Entries": {"@odata.id": f"{sys_}/LogServices/SEL/Entries"}})
        self._entries()
        self._put("Managers", _coll("/redfish/v1/Managers", [mgr]))
        self._put("Managers/BMC", {"@odata.id": mgr, "@odata.type": "#Manager.v1_15_0.Manager", "Id": "BMC",
                                   "Name": "BMC", "ManagerType": "BMC", "FirmwareVersion": bmc_version})
        fw = "/redfish/v1/UpdateService/FirmwareInventory"
        self._put("UpdateService", {"@odata.id": "/redfish/v1/UpdateService", "Id": "UpdateService",
                                    "@odata.type": "#UpdateService.v1_11_0.UpdateService",
                                    "FirmwareInventory": {"@odata.id": fw}})
        ids = [f"GPU{i}" for i in range(len(gpu_versions))]
        self._put("UpdateService/FirmwareInventory", _coll(fw, [f"{fw}/{i}" for i in ids]))
        for i, v in zip(ids, gpu_versions, strict=True):
            self._put(f"UpdateService/FirmwareInventory/{i}", {
                "@odata.id": f"{fw}/{i}", "@odata.type": "#SoftwareInventory.v1_9_0.SoftwareInventory",
                "Id": i, "Name": f"GPU {i[3:]} VBIOS", "Version": v})

    def add_entry(self, entry_id: str, created: datetime, *, sensor: str, severity: str, message: str,
                  code: str = "Assert") -> None:
        """One SEL entry (Redfish LogEntry, EntryType SEL)."""
        path = f"/redfish/v1/Systems/1/LogServices/SEL/Entries/{entry_id}"
        self._put(f"Systems/1/LogServices/SEL/Entries/{entry_id}", {
            "@odata.id": path, "@odata.type": "#LogEntry.v1_15_0.LogEntry", "Id": entry_id,
            "Name": "Log Entry", "EntryType": "SEL", "Created": created.isoformat(), "Severity": severity,
            "SensorType": sensor, "EntryCode": code, "Message": message, "SensorNumber": 40 + len(self.entries)})
        self.entries.append(path)
        self._entries()

    def _entries(self) -> None:
        self._put("Systems/1/LogServices/SEL/Entries",
                  _coll("/redfish/v1/Systems/1/LogServices/SEL/Entries", self.entries))

    def _put(self, rel: str, doc: dict[str, Any]) -> None:
        d = self.root / rel
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / ".index.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(d / "index.json")


def _coll(path: str, members: list[str]) -> dict[str, Any]:
    return {"@odata.id": path, "Name": "Collection", "Members@odata.count": len(members),
            "Members": [{"@odata.id": m} for m in members]}
