"""Tenants and the node pools they own (docs/tenancy.md). Pure.

A tenant is a name, the nodes it owns (glob patterns such as ``r01-*`` or plain node names) and an
optional InfiniBand partition key. Who owns a node *now* is :func:`owner`: the owner recorded by the
last completed move (the controller's store) when there is one, else the configured pool the node
matches. A node matching two tenants' pools is an error (:func:`check_pools`), never a guess.

Errors are :class:`~gpufleet.domain.errors.InvalidInput` naming the field, the value and what was expected.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufleet.domain.errors import InvalidInput

TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_NODE_PATTERN = re.compile(r"^[A-Za-z0-9._\-*?\[\]!]{1,128}$")
_GLOB = re.compile(r"[*?\[]")
# OpenSM: a P_Key is 15 bits (the 16th is the membership bit, written as full/limited); 0x7fff is the
# default partition every port is in (the subnet manager's own), 0x0000 is invalid.
PKEY_MIN, PKEY_MAX, DEFAULT_PKEY = 0x0001, 0x7FFE, 0x7FFF
PKEY_EXPECTED = "a partition key 0x0001..0x7ffe (hex, e.g. 0x0a01; 0x7fff is the default partition)"


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    nodes: tuple[str, ...]  # glob patterns or node names
    pkey: int | None = None

    def matches(self, node: str) -> bool:
        return any(fnmatch.fnmatchcase(node, p) for p in self.nodes)


def tenant_name(field: str, value: str) -> str:
    if not TENANT_NAME.match(value):
        raise InvalidInput(field, value, "a tenant name: lowercase letters, digits, - and _, at most 63")
    return value


def node_pattern(field: str, value: str) -> str:
    if not _NODE_PATTERN.match(value) or value.count("[") != value.count("]"):
        raise InvalidInput(field, value, "a node name or glob pattern (letters, digits, . _ - and * ? [...])")
    return value


def parse_pkey(field: str, value: str) -> int:
    if not re.fullmatch(r"0x[0-9a-fA-F]{1,4}", value):
        raise InvalidInput(field, value, PKEY_EXPECTED)
    key = int(value, 16)
    if not PKEY_MIN <= key <= PKEY_MAX:
        raise InvalidInput(field, value, PKEY_EXPECTED)
    return key


def check_static(tenants: Sequence[Tenant]) -> None:
    """What can be told without the node list: unique names and keys, no node name in two pools."""
    names: dict[str, int] = {}
    keys: dict[int, str] = {}
    for i, t in enumerate(tenants):
        if t.name in names:
            raise InvalidInput(f"tenant[{i}].name", t.name, f"a name not used by tenant[{names[t.name]}]")
        names[t.name] = i
        if t.pkey is not None:
            if t.pkey in keys:
                raise InvalidInput(f"tenant[{i}].pkey", f"0x{t.pkey:04x}",
                                   f"a partition key not used by tenant {keys[t.pkey]!r}")
            keys[t.pkey] = t.name
    for i, t in enumerate(tenants):
        for p in t.nodes:
            if _GLOB.search(p):
                continue
            for j, other in enumerate(tenants):
                if j != i and other.matches(p):
                    raise InvalidInput(f"tenant[{i}].nodes", p, f"a node in one tenant's pool only (tenant "
                                       f"{other.name!r} owns it too)")


def check_pools(tenants: Sequence[Tenant], nodes: Iterable[str]) -> None:
    """Against the registered nodes: every pattern matches one, and no node is in two pools."""
    known = sorted(set(nodes))
    if not known:
        return  # a first start: nothing registered yet (checked again on the next start)
    for i, t in enumerate(tenants):
        for p in t.nodes:
            if not any(fnmatch.fnmatchcase(n, p) for n in known):
                raise InvalidInput(f"tenant[{i}].nodes", p, f"a pattern or name matching a registered node "
                                   f"(none of the {len(known)} registered matches)")
    for n in known:
        owners = [t.name for t in tenants if t.matches(n)]
        if len(owners) > 1:
            i = next(k for k, t in enumerate(tenants) if t.name == owners[1])
            raise InvalidInput(f"tenant[{i}].nodes", n, f"node pools that do not overlap ({n} is in the pools of "
                               f"{' and '.join(repr(o) for o in owners)})")


def owner(node: str, tenants: Sequence[Tenant], recorded: Mapping[str, str | None]) -> str | None:
    """The tenant that owns ``node`` now: the recorded owner (None while a move runs or after one failed)
    when the store has one, else the one configured pool it matches (None for none, or for two)."""
    if node in recorded:
        return recorded[node]
    found = [t.name for t in tenants if t.matches(node)]
    return found[0] if len(found) == 1 else None
