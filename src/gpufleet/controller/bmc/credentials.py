"""BMC addresses and credentials per node: the secrets file ``[repair] bmc_file`` names (docs/bmc.md).

The file is TOML, readable by the controller's user only (a group- or world-readable file is refused)::

    [defaults]                          # optional: what every node entry does not say
    username = "gpufleet"
    password = "file:/etc/gpufleet/bmc/password"   # or "env:GPUFLEET_BMC_PASSWORD", or the literal

    [nodes.n1]
    address = "https://10.40.0.11"      # the BMC's Redfish service (scheme + host[:port])
    system = ""                         # optional ComputerSystem id; "" = the service's only system

A password (or username) of the form ``file:PATH`` is read from that file (first line); ``env:NAME``
from the controller's environment. The value is held in a :class:`Secret`, whose ``repr``/``str`` never
show it; it is handed only to the Redfish client. Nothing here ever logs, audits or returns a secret.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpufleet.domain.errors import InvalidInput


class Secret:
    """A credential: never shown by ``repr``/``str``/formatting; ``reveal()`` hands it to the client."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class BmcTarget:
    node: str
    address: str  # scheme://host[:port], no path, no credentials
    username: Secret
    password: Secret
    system: str = ""  # ComputerSystem id ("" = the only one)


def resolve(field: str, value: str, env: Mapping[str, str]) -> Secret:
    """``file:PATH`` / ``env:NAME`` / a literal -> the secret (never echoed in an error)."""
    if value.startswith("file:"):
        path = Path(value[5:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise InvalidInput(field, f"file:{path}", f"a readable file ({err.strerror})") from None
        lines = text.splitlines()
        return Secret(lines[0].strip() if lines else "")
    if value.startswith("env:"):
        name = value[4:]
        if name not in env:
            raise InvalidInput(field, f"env:{name}", "an environment variable set for the controller")
        return Secret(env[name])
    return Secret(value)


def load_targets(path: Path, *, allow_http: bool = False,
                 env: Mapping[str, str] | None = None) -> dict[str, BmcTarget]:
    """The BMC of every node in the secrets file at ``path`` (InvalidInput names the bad entry)."""
    env = os.environ if env is None else env
    try:
        mode = path.stat().st_mode
        raw = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InvalidInput("repair.bmc_file", str(path), f"a readable file ({err.strerror})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidInput("repair.bmc_file", f"{path} (mode {stat.S_IMODE(mode):o})",
                           "a file only its owner can read (chmod 600): it holds BMC credentials")
    try:
        doc = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as err:
        raise InvalidInput("repair.bmc_file", str(path), f"valid TOML ({err})") from None
    defaults: dict[str, Any] = doc.get("defaults", {})
    nodes: dict[str, Any] = doc.get("nodes", {})
    extra = set(doc) - {"defaults", "nodes"}
    if extra:
        raise InvalidInput("repair.bmc_file", f"{path}: [{sorted(extra)[0]}]", "only [defaults] and [nodes.<node>]")
    out: dict[str, BmcTarget] = {}
    for node, entry in nodes.items():
        if not isinstance(entry, dict):
            raise InvalidInput(f"nodes.{node}", type(entry).__name__, "a table with address, username, password")
        merged = {**defaults, **entry}
        unknown = set(merged) - {"address", "username", "password", "system"}
        if unknown:
            raise InvalidInput(f"nodes.{node}.{sorted(unknown)[0]}", "(set)", "address, username, password, system")
        for key in ("address", "username", "password"):
            if not isinstance(merged.get(key), str) or not merged[key]:
                raise InvalidInput(f"nodes.{node}.{key}", "(missing)", "a non-empty string")
        out[node] = BmcTarget(node, _address(node, merged["address"], allow_http),
                              resolve(f"nodes.{node}.username", merged["username"], env),
                              resolve(f"nodes.{node}.password", merged["password"], env),
                              str(merged.get("system", "")))
    return out


def _address(node: str, value: str, allow_http: bool) -> str:
    parts = urlsplit(value)
    field = f"nodes.{node}.address"
    if parts.username or parts.password:
        raise InvalidInput(field, "(a URL with credentials)", "scheme://host[:port] without credentials")
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.path not in ("", "/"):
        raise InvalidInput(field, value, "https://host[:port] (the BMC's Redfish service)")
    if parts.scheme == "http" and not allow_http:
        raise InvalidInput(field, value, "https:// (plain HTTP only with [repair] bmc_allow_http = true)")
    return f"{parts.scheme}://{parts.netloc}"
