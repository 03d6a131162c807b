"""One node's BMC through Redfish, with OpenStack's ``sushy`` client (decision record 0090).

What gpufleet asks of a BMC: the power state; graceful restart, force restart and a **power cycle**
(``ForceOff``, wait until the BMC reports ``Off``, then ``On``: each half is observable, where a single
``PowerCycle`` reset is not, and many BMCs do not offer it); a **one-time boot override to PXE** (for a
reprovision); the **System Event Log** entries (``LogServices``: the system's and the managers', the
SEL ones first); and the **firmware versions** (the BMC's own, the BIOS, and ``UpdateService``'s
``FirmwareInventory``, which lists GPUs on servers whose BMC exposes them).

TLS is verified against the system trust store or the site CA bundle (``[repair] bmc_ca_bundle``); the
client never turns verification off. Every failure is an :class:`ExternalError` whose text never
contains the credentials; the client's own logger is capped at INFO (its DEBUG request lines show a
session login's user name).

``sushy`` (and ``requests`` under it) is imported on first use, not with the module: the controller
imports this adapter at every start, most controllers have no BMC, and the import took 0.3-0.45 s of
each start on the reference box (tests/integration/test_controller_imports.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpufleet.domain.errors import ExternalError

from .credentials import BmcTarget

if TYPE_CHECKING:
    import sushy
    from sushy import connector as sushy_connector

log = logging.getLogger(__name__)
T = TypeVar("T")
# sushy masks the password in its DEBUG request lines but not the user name of a session login
# (tests/integration/bmc: the credentials never appear in a log, even at DEBUG): its logger is capped
# at INFO, whatever the root level. Its INFO and above never carry a credential.
logging.getLogger("sushy").setLevel(logging.INFO)
MAX_ENTRIES = 2000  # entries read per log service and poll (newest last)


class Reset(StrEnum):
    GRACEFUL_RESTART = "GracefulRestart"
    FORCE_RESTART = "ForceRestart"
    FORCE_OFF = "ForceOff"
    ON = "On"


@dataclass(frozen=True, slots=True)
class FirmwareItem:
    id: str
    name: str
    version: str


@dataclass(frozen=True, slots=True)
class Firmware:
    bmc: str  # the manager's FirmwareVersion ("" = not reported)
    bios: str  # the system's BiosVersion
    components: tuple[FirmwareItem, ...] = field(default=())  # UpdateService/FirmwareInventory (GPUs, NICs, ...)


class RedfishBmc:
    """One BMC. Thread-safe (one lock); the session is opened on first use and reused."""

    def __init__(self, target: BmcTarget, *, ca_bundle: Path | None = None, timeout: float = 15.0) -> None:
        self.target = target
        self._verify: bool | str = str(ca_bundle) if ca_bundle is not None else True
        self._timeout = timeout
        self._root: sushy.Sushy | None = None
        self._conn: sushy_connector.Connector | None = None
        self._lock = threading.Lock()

    # ---- power ------------------------------------------------------------------------------
    def power_state(self) -> str:
        return _text(self._call(lambda: self._system().power_state))

    def reset(self, kind: Reset) -> None:
        import sushy

        self._call(lambda: self._system().reset_system(sushy.ResetType(kind.value)))

    def allowed_resets(self) -> set[str]:
        return {_text(v) for v in self._call(lambda: self._system().get_allowed_reset_system_values())}

    # ---- boot -------------------------------------------------------------------------------
    def boot_once_pxe(self) -> None:
        """The next boot (only) from the network: BootSourceOverrideTarget=Pxe, Enabled=Once."""
        import sushy

        self._call(lambda: self._system().set_system_boot_options(
            sushy.BootSource.PXE, enabled=sushy.BootSourceOverrideEnabled.ONCE))

    def boot_override(self) -> tuple[str, str]:
        """(target, enabled) of the boot source override as the BMC reports it now."""
        def read() -> tuple[str, str]:
            sys = self._system()
            sys.refresh()
            return _text(sys.boot.target), _text(sys.boot.enabled)
        return self._call(read)

    # ---- logs and inventory -----------------------------------------------------------------
    def sel_entries(self) -> list[dict[str, Any]]:
        """The entries of the BMC's event logs (the SEL ones when the BMC names them), as Redfish
        ``LogEntry`` documents with ``LogService`` (the service's id) added. [] without LogServices."""
        return self._call(lambda: list(self._entries()))

    def firmware(self) -> Firmware:
        def read() -> Firmware:
            sys = self._system()
            doc = self._get(sys.path)
            bmc = ""
            for link in _members(doc.get("Links", {}).get("ManagedBy", [])) or self._collection("Managers"):
                bmc = str(self._get(link).get("FirmwareVersion") or "")
                if bmc:
                    break
            items = []
            for link in self._collection("UpdateService/FirmwareInventory"):
                d = self._get(link)
                items.append(FirmwareItem(str(d.get("Id", "")), str(d.get("Name", "")), str(d.get("Version", ""))))
            return Firmware(bmc, str(doc.get("BiosVersion") or ""), tuple(items))
        return self._call(read)

    def close(self) -> None:
        from sushy import exceptions as sushy_exc

        with self._lock:
            if self._root is not None:
                with contextlib.suppress(sushy_exc.SushyError):
                    self._root.close()  # ends the Redfish session (BMCs have few session slots)
            self._root = self._conn = None

    # ---- plumbing ---------------------------------------------------------------------------
    def _call(self, fn: Callable[[], T]) -> T:
        from sushy import exceptions as sushy_exc

        with self._lock:
            try:
                return fn()
            except sushy_exc.SushyError as err:
                if isinstance(err, sushy_exc.ConnectionError):
                    self._root = self._conn = None  # reconnect next time
                raise ExternalError(f"BMC of {self.target.node}", self._scrub(str(err))) from None
            except (OSError, ValueError, KeyError) as err:  # a malformed document
                raise ExternalError(f"BMC of {self.target.node}", self._scrub(f"{type(err).__name__}: {err}")) from None

    def _scrub(self, text: str) -> str:
        for s in (self.target.password.reveal(), self.target.username.reveal()):
            if s:
                text = text.replace(s, "***")
        return text[:500]

    def _connect(self) -> sushy.Sushy:
        if self._root is None:
            import sushy
            from sushy import auth as sushy_auth
            from sushy import connector as sushy_connector

            t = self.target
            self._conn = sushy_connector.Connector(
                t.address, verify=self._verify, server_side_retries=1, server_side_retries_delay=1,
                default_request_timeout=self._timeout, connect_timeout=min(5.0, self._timeout))
            auth = sushy_auth.SessionOrBasicAuth(username=t.username.reveal(), password=t.password.reveal())
            self._root = sushy.Sushy(t.address, auth=auth, connector=self._conn)
        return self._root

    def _system(self) -> Any:
        root = self._connect()
        if self.target.system:
            return root.get_system(f"{root.get_system_collection().path.rstrip('/')}/{self.target.system}")
        return root.get_system()  # the only system (sushy raises if there are several)

    def _get(self, path: str) -> dict[str, Any]:
        self._connect()
        assert self._conn is not None
        doc = self._conn.get(path).json()
        return doc if isinstance(doc, dict) else {}

    def _collection(self, rel: str) -> list[str]:
        from sushy import exceptions as sushy_exc

        try:
            return _members(self._get(f"/redfish/v1/{rel}").get("Members", []))
        except sushy_exc.ResourceNotFoundError:
            return []

    def _entries(self) -> Iterator[dict[str, Any]]:
        from sushy import exceptions as sushy_exc

        sys = self._system()
        services: list[str] = []
        for owner in [sys.path, *self._collection("Managers")]:
            link = self._get(owner).get("LogServices", {}).get("@odata.id")
            if link:
                try:
                    services += _members(self._get(link).get("Members", []))
                except sushy_exc.ResourceNotFoundError:
                    continue
        docs = [(s, self._get(s)) for s in services]
        sel = [(s, d) for s, d in docs if d.get("LogEntryType") == "SEL" or str(d.get("Id", "")).upper() == "SEL"]
        for path, doc in sel or docs:
            entries = doc.get("Entries", {}).get("@odata.id")
            if not entries:
                continue
            coll = self._get(entries)
            members = coll.get("Members", [])[-MAX_ENTRIES:]
            for m in members:
                entry = m if "Id" in m else self._get(m["@odata.id"])
                yield {**entry, "LogService": str(doc.get("Id") or path.rstrip("/").rsplit("/", 1)[-1])}


def _members(items: Any) -> list[str]:
    return [str(m["@odata.id"]) for m in items or [] if isinstance(m, dict) and "@odata.id" in m]


def _text(v: Any) -> str:
    """A sushy enum member (``PowerState.ON``) or a plain value as the Redfish string (``On``)."""
    return str(getattr(v, "value", v))
