"""OpenSM ``partitions.conf`` entries per tenant (docs/tenancy.md#infiniband-partition-keys). Pure.

:func:`render` writes, for every tenant with a partition key, one partition whose members are its
nodes' HCA port GUIDs with **full** membership, and the default partition with every other port
**limited** (``Default=0x7fff : ALL=limited, SELF=full``): two limited members cannot talk to each
other, so a port talks only to the ports of its own tenant's partition (and to the subnet manager).
A tenant's ports are split over several lines of the same key when there are many (OpenSM merges
entries that share a key; a line is at most 4096 characters).

:func:`check_grammar` parses a file by OpenSM's documented grammar (doc/partition-config.txt)::

    <Partition Definition> : [<newline>] <Partition Properties> ;
    Partition Definition:  [PartitionName][=PKey][,indx0][,ipoib_bc_flags][,defmember=full|limited|both]
    Port list:             <Port Specifier>[,<Port Specifier>]    Port Specifier: <PortGUID>[=full|limited|both]
                           (ALL, ALL_CAS, ALL_SWITCHES, ALL_ROUTERS, SELF are keywords for groups of ports)

and returns the problems, each naming the statement. Multicast group definitions (``mgid=...``) are
valid OpenSM but never generated here; the checker reports them as unsupported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gpufleet.domain.errors import InvalidInput
from gpufleet.domain.inventory import NodeInventory
from gpufleet.domain.tenancy import DEFAULT_PKEY, Tenant

MAX_LINE = 4096  # OpenSM's line buffer
PER_LINE = 64  # port GUIDs per line: 64 x 20 characters stay well under MAX_LINE
_GUID = re.compile(r"^(0x[0-9a-fA-F]{1,16}|[0-9]{1,20})$")
_KEYWORDS = {"ALL", "ALL_CAS", "ALL_SWITCHES", "ALL_ROUTERS", "SELF"}
_MEMBERSHIP = {"full", "limited", "both"}
_FLAGS = {"ipoib", "indx0"}
_VALUED = {"rate", "mtu", "sl", "scope", "defmember", "qkey", "tclass", "fl"}
_NAME = re.compile(r"^[^\s=,:;#]*$")


def port_guids(inv: NodeInventory) -> list[str]:
    """The node's InfiniBand HCA port GUIDs (Ethernet/RoCE ports are not in a subnet manager's fabric)."""
    out = []
    for nic in inv.nics:
        for p in nic.ports:
            if p.guid and p.link_layer.lower() in ("", "infiniband"):
                if not re.fullmatch(r"(0x)?[0-9a-fA-F]{1,16}", p.guid):
                    raise InvalidInput(f"{inv.node}: {nic.device} port {p.port} guid", p.guid,
                                       "a port GUID such as 0x9c63c00300abcd01")
                out.append(f"0x{int(p.guid, 16):016x}")
    return out


def render(tenants: Sequence[Tenant], members: Mapping[str, Sequence[str]], guids: Mapping[str, Sequence[str]],
           *, source: str = "") -> str:
    """``members``: tenant -> its nodes; ``guids``: node -> its port GUIDs (``port_guids``)."""
    lines = ["# OpenSM partitions.conf: one partition per tenant (gpufleet tenancy pkeys; docs/tenancy.md)",
             *([f"# from {source}"] if source else []),
             "# Every other port is a limited member of the default partition: tenants cannot reach each other.",
             f"Default=0x{DEFAULT_PKEY:04x}, ipoib : ALL=limited, SELF=full ;", ""]
    for t in sorted(tenants, key=lambda t: t.name):
        nodes = sorted(members.get(t.name, ()))
        if t.pkey is None:
            lines += [f"# tenant {t.name}: no pkey configured ({len(nodes)} node(s) only in the default partition)",
                      ""]
            continue
        ports = [g for n in nodes for g in guids.get(n, ())]
        missing = [n for n in nodes if not guids.get(n)]
        lines.append(f"# tenant {t.name}: {len(nodes)} node(s), {len(ports)} port(s)")
        if missing:
            lines.append(f"# no port GUIDs known for: {', '.join(missing)}")
        head = f"{t.name}=0x{t.pkey:04x}, ipoib, defmember=full"
        if not ports:
            lines.append(f"{head} : ;")
        for i in range(0, len(ports), PER_LINE):
            lines.append(f"{head} : {', '.join(ports[i:i + PER_LINE])} ;")
        lines.append("")
    return "\n".join(lines)


def check_grammar(text: str) -> list[str]:
    """Problems with ``text`` by OpenSM's documented partitions.conf grammar (empty: none)."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        if len(line) >= MAX_LINE:
            problems.append(f"line {n}: {len(line)} characters (OpenSM reads at most {MAX_LINE - 1})")
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    statements = body.split(";")
    if statements[-1].strip():
        problems.append(f"statement {len(statements)}: {statements[-1].strip()[:60]!r} does not end with ';'")
    keys: dict[int, str] = {}
    for i, st in enumerate(statements[:-1], 1):
        if not st.strip():
            continue
        where = f"statement {i} ({st.strip()[:40]!r})"
        if ":" not in st:
            problems.append(f"{where}: no ':' between the partition definition and its ports")
            continue
        definition, _, props = st.partition(":")
        problems += [f"{where}: {p}" for p in _definition(definition.strip(), keys)]
        problems += [f"{where}: {p}" for p in _ports(props)]
    return problems


def _definition(text: str, keys: dict[int, str]) -> list[str]:
    parts = [p.strip() for p in text.split(",")]
    name, eq, pkey = parts[0].partition("=")
    out = []
    name, pkey = name.strip(), pkey.strip()
    if not _NAME.match(name):
        out.append(f"partition name {name!r} has a character OpenSM splits on")
    if eq:
        if not re.fullmatch(r"0x[0-9a-fA-F]{1,4}|[0-9]{1,5}", pkey) or int(pkey, 0) > 0xFFFF:
            out.append(f"P_Key {pkey!r} is not a 16-bit number (0x... or decimal)")
        else:
            key = int(pkey, 0) & 0x7FFF
            if key in keys and keys[key] != name:
                out.append(f"P_Key 0x{key:04x} is also partition {keys[key]!r} (OpenSM would merge them)")
            keys.setdefault(key, name)
    for flag in parts[1:]:
        k, eq, v = (s.strip() for s in flag.partition("="))
        if k in _FLAGS and not eq:
            continue
        if k == "defmember" and v in _MEMBERSHIP:
            continue
        if k in _VALUED - {"defmember"} and re.fullmatch(r"0x[0-9a-fA-F]+|[0-9]+", v):
            continue
        out.append(f"flag {flag!r} is not one of ipoib, indx0, defmember=full|limited|both, rate|mtu|sl|scope=N")
    return out


def _ports(text: str) -> list[str]:
    out = []
    specs = [s.strip() for s in text.split(",")]
    if specs == [""]:
        return []  # an empty list: a partition without ports
    for s in specs:
        guid, eq, member = (x.strip() for x in s.partition("="))
        if guid.lower().startswith("mgid"):
            out.append(f"{s!r}: multicast group definitions are not checked here")
        elif not (guid in _KEYWORDS or _GUID.match(guid)):
            out.append(f"port {guid!r} is not a GUID (0x + up to 16 hex digits) or ALL/ALL_CAS/ALL_SWITCHES/"
                       "ALL_ROUTERS/SELF")
        elif eq and member not in _MEMBERSHIP:
            out.append(f"port {guid!r}: membership {member!r} is not full, limited or both")
    return out
