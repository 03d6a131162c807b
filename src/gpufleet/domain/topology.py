"""The physical topology of a GPU fabric: components (slots) in a containment tree, joined by links.

A *component* is a position (``r01-n03-gpu5``) with a ``kind`` and the ``serial`` of the physical unit
sitting there now; its ``parent`` is the enclosing position (a GPU's node or compute tray, a tray's
rack). A *link* is a cable or an NVLink lane between two components and can itself be blamed by its
id. The interchange form is ``gpufleet.topology/v1`` (docs/formats.md)::

    {"format": "gpufleet.topology/v1",
     "components": [{"id": "r01-n03-gpu5", "kind": "gpu", "parent": "r01-n03", "serial": "16549..."}],
     "links": [{"id": "r01-n03-nic5~leaf-su1-r5", "kind": "ib", "a": "r01-n03-nic5", "b": "leaf-su1-r5"}]}

:func:`load_topology` validates (unknown kind, dangling parent or link end, duplicate id, cycles) and
raises :class:`~gpufleet.domain.errors.InvalidInput` naming the offending field; :func:`dump_topology`
writes the same form back. Everything else here is pure.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.domain.errors import InvalidInput, NotFound
from gpufleet.domain.fleet import ComponentKind, Fleet, Gpu, Nic, Node

FORMAT = "gpufleet.topology/v1"

# A failed unit of these kinds takes the nodes behind it out of service (see Topology.nodes_behind).
UNIT_KINDS: frozenset[ComponentKind] = frozenset(
    {ComponentKind.NODE, ComponentKind.COMPUTE_TRAY, ComponentKind.SWITCH_TRAY}
)
HOST_KINDS: frozenset[ComponentKind] = frozenset({ComponentKind.NODE, ComponentKind.COMPUTE_TRAY})
FABRIC_SWITCH_KINDS: frozenset[ComponentKind] = frozenset(
    {ComponentKind.LEAF_SWITCH, ComponentKind.SPINE_SWITCH, ComponentKind.CORE_SWITCH}
)


@dataclass(frozen=True, slots=True)
class Component:
    id: str
    kind: ComponentKind
    parent: str | None = None
    serial: str = ""


@dataclass(frozen=True, slots=True)
class Link:
    id: str
    kind: str  # "nvlink" | "ib" (free text in the format; these two are what the generators write)
    a: str
    b: str

    def other(self, end: str) -> str:
        """The far end of the link as seen from ``end``."""
        return self.b if end == self.a else self.a


class Topology:
    """An immutable, validated topology with the indexes the correlation engine needs.

    Build it with :meth:`of` (validates) or :func:`load_topology`.
    """

    __slots__ = ("_by_id", "_children", "_host", "_links", "_links_of", "_unit")

    def __init__(
        self, components: Mapping[str, Component], links: Mapping[str, Link]
    ) -> None:  # use Topology.of(...), which validates
        self._by_id = dict(components)
        self._links = dict(links)
        self._children: dict[str, list[str]] = {}
        self._links_of: dict[str, list[str]] = {}
        for c in self._by_id.values():
            if c.parent is not None:
                self._children.setdefault(c.parent, []).append(c.id)
        for ln in self._links.values():
            self._links_of.setdefault(ln.a, []).append(ln.id)
            self._links_of.setdefault(ln.b, []).append(ln.id)
        self._host: dict[str, str | None] = {}
        self._unit: dict[str, str | None] = {}

    # -- construction -------------------------------------------------------------------------------

    @classmethod
    def of(cls, components: Iterable[Component], links: Iterable[Link] = ()) -> Topology:
        """Validate and index. Raises InvalidInput naming the offending entry."""
        by_id: dict[str, Component] = {}
        for i, c in enumerate(components):
            if not c.id:
                raise InvalidInput(f"components[{i}].id", c.id, "a non-empty id")
            if c.id in by_id:
                raise InvalidInput(f"components[{i}].id", c.id, "an id not used by another component")
            by_id[c.id] = c
        for i, c in enumerate(by_id.values()):
            if c.parent is not None and c.parent not in by_id:
                raise InvalidInput(f"components[{i}].parent", c.parent, "the id of a component in the file")
        _check_acyclic(by_id)
        by_link: dict[str, Link] = {}
        for i, ln in enumerate(links):
            if not ln.id:
                raise InvalidInput(f"links[{i}].id", ln.id, "a non-empty id")
            if ln.id in by_link or ln.id in by_id:
                raise InvalidInput(f"links[{i}].id", ln.id, "an id not used by another link or component")
            for end, value in (("a", ln.a), ("b", ln.b)):
                if value not in by_id:
                    raise InvalidInput(f"links[{i}].{end}", value, "the id of a component in the file")
            if ln.a == ln.b:
                raise InvalidInput(f"links[{i}].b", ln.b, "a component other than end a")
            by_link[ln.id] = ln
        return cls(by_id, by_link)

    # -- lookups ------------------------------------------------------------------------------------

    def __contains__(self, ident: object) -> bool:
        return ident in self._by_id or ident in self._links

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def components(self) -> Mapping[str, Component]:
        return self._by_id

    @property
    def links(self) -> Mapping[str, Link]:
        return self._links

    def component(self, ident: str) -> Component:
        try:
            return self._by_id[ident]
        except KeyError:
            raise NotFound("component", ident) from None

    def get(self, ident: str) -> Component | None:
        return self._by_id.get(ident)

    def link(self, ident: str) -> Link:
        try:
            return self._links[ident]
        except KeyError:
            raise NotFound("link", ident) from None

    def get_link(self, ident: str) -> Link | None:
        return self._links.get(ident)

    def children(self, ident: str) -> tuple[str, ...]:
        return tuple(self._children.get(ident, ()))

    def children_of_kind(self, ident: str, kind: ComponentKind) -> tuple[str, ...]:
        """``ident``'s children of ``kind`` in natural id order (``gpu2`` before ``gpu10``): a host's
        GPUs and NICs by index, the way an agent numbers them."""
        kids = (k for k in self._children.get(ident, ()) if self._by_id[k].kind == kind)
        return tuple(sorted(kids, key=natural_key))

    def links_of(self, ident: str) -> tuple[str, ...]:
        """Ids of the links with ``ident`` at one end."""
        return tuple(self._links_of.get(ident, ()))

    def ancestors(self, ident: str) -> tuple[str, ...]:
        """Enclosing positions, nearest first (``gpu -> node -> rack``)."""
        out: list[str] = []
        cur = self.component(ident).parent
        while cur is not None:
            out.append(cur)
            cur = self._by_id[cur].parent
        return tuple(out)

    def descendants(self, ident: str) -> tuple[str, ...]:
        """Every position inside ``ident`` (not including it), depth first."""
        out: list[str] = []
        stack = list(self._children.get(ident, ()))
        while stack:
            cur = stack.pop()
            out.append(cur)
            stack.extend(self._children.get(cur, ()))
        return tuple(out)

    def of_kind(self, kind: ComponentKind) -> list[str]:
        return [c.id for c in self._by_id.values() if c.kind == kind]

    def node_of(self, ident: str) -> str | None:
        """The enclosing node or compute tray of ``ident`` (itself if it is one), else None."""
        return self._enclosing(ident, HOST_KINDS, self._host)

    def unit_of(self, ident: str) -> str | None:
        """The nearest replaceable unit (node, compute tray or switch tray) enclosing ``ident`` or
        ``ident`` itself when it is one; None for a free-standing switch or a rack."""
        return self._enclosing(ident, UNIT_KINDS, self._unit)

    def _enclosing(self, ident: str, kinds: Container[str], cache: dict[str, str | None]) -> str | None:
        """The nearest of ``ident`` and its ancestors whose kind is in ``kinds`` (memoised in ``cache``)."""
        if ident in cache:
            return cache[ident]
        comp = self._by_id.get(ident)
        if comp is None:
            raise NotFound("component", ident)
        found: str | None = None
        cur: Component | None = comp
        while cur is not None:
            if cur.kind in kinds:
                found = cur.id
                break
            cur = self._by_id[cur.parent] if cur.parent is not None else None
        cache[ident] = found
        return found

    def kind_of(self, ident: str) -> str:
        """The component kind, or the link kind for a link id."""
        comp = self._by_id.get(ident)
        if comp is not None:
            return comp.kind.value
        return self.link(ident).kind

    def nodes_behind(self, ident: str) -> tuple[str, ...]:
        """The node / compute-tray ids that lose service when ``ident`` (component or link) fails.

        * a node or tray, or anything inside one: that node/tray;
        * a link: the hosts at its ends (none for a switch-to-switch cable: the fat-tree routes around);
        * a leaf switch: every host with a NIC cabled to it (each loses that rail);
        * an NVSwitch chip outside a host, or a switch tray: every host whose GPUs are linked to it;
        * a rack: every host in it; a spine or core switch: none (redundant paths).
        """
        if ident in self._links:
            ln = self._links[ident]
            return tuple(sorted({h for h in (self.node_of(ln.a), self.node_of(ln.b)) if h}))
        comp = self.component(ident)
        host = self.node_of(ident)
        if host is not None:
            return (host,)
        if comp.kind in (ComponentKind.SPINE_SWITCH, ComponentKind.CORE_SWITCH):
            return ()
        scope = (ident, *self.descendants(ident))
        if comp.kind == ComponentKind.RACK:
            return tuple(sorted({h for c in scope if (h := self.node_of(c)) is not None}))
        hosts: set[str] = set()
        for c in scope:
            for lid in self._links_of.get(c, ()):
                h = self.node_of(self._links[lid].other(c))
                if h is not None:
                    hosts.add(h)
        return tuple(sorted(hosts))


def to_fleet(topo: Topology, sku: str = "") -> Fleet:
    """The inventory view of a topology: one :class:`Node` per node / compute tray, its GPUs and NICs
    in id order (index = position), each NIC's leaf from its ``ib`` link, the rack from the
    ancestors. ``Node.domains`` then names the same racks and leaves the correlation engine blames.
    ``sku`` defaults to H100-SXM for HGX nodes and GB200 for NVL72 compute trays; PCI addresses are
    not in the topology and stay empty."""
    nodes: list[Node] = []
    for comp in topo.components.values():
        if comp.kind not in HOST_KINDS:
            continue
        gpu_ids = topo.children_of_kind(comp.id, ComponentKind.GPU)
        nic_ids = topo.children_of_kind(comp.id, ComponentKind.NIC)
        model = sku or ("H100-SXM" if comp.kind == ComponentKind.NODE else "GB200")
        gpus = tuple(Gpu(g, i, topo.components[g].serial, sku=model) for i, g in enumerate(gpu_ids))
        nics = tuple(Nic(n, i, topo.components[n].serial, _leaf_of(topo, n)) for i, n in enumerate(nic_ids))
        rack = next((a for a in topo.ancestors(comp.id) if topo.components[a].kind == ComponentKind.RACK), "")
        nodes.append(Node(comp.id, rack, comp.serial, gpus, nics))
    return Fleet.of(nodes)


def _leaf_of(topo: Topology, nic: str) -> str:
    for lid in topo.links_of(nic):
        far = topo.links[lid].other(nic)
        if topo.components[far].kind == ComponentKind.LEAF_SWITCH:
            return far
    return ""


def natural_key(ident: str) -> tuple[str, int]:
    """``gpu10`` after ``gpu9``: the trailing number compares as a number."""
    head = ident.rstrip("0123456789")
    tail = ident[len(head) :]
    return head, int(tail) if tail else -1


def _check_acyclic(by_id: Mapping[str, Component]) -> None:
    state: dict[str, int] = {}
    for i, start in enumerate(by_id):
        path: list[str] = []
        cur: str | None = start
        while cur is not None and state.get(cur, 0) == 0:
            state[cur] = 1
            path.append(cur)
            cur = by_id[cur].parent
        if cur is not None and state.get(cur) == 1:
            raise InvalidInput(f"components[{i}].parent", by_id[start].parent, "a parent chain without a cycle")
        for p in path:
            state[p] = 2


# -- interchange --------------------------------------------------------------------------------------


def load_topology(source: str | Path) -> Topology:
    """Load ``gpufleet.topology/v1`` from a path or from the JSON text itself (text starts with ``{``)."""
    if isinstance(source, Path) or not source.lstrip().startswith("{"):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise NotFound("topology file", str(path)) from None
    else:
        text = source
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput("topology", f"line {err.lineno} col {err.colno}", f"valid JSON ({err.msg})") from None
    return parse_topology(doc)


def parse_topology(doc: Any) -> Topology:
    """Validate a parsed ``gpufleet.topology/v1`` document into a :class:`Topology`."""
    if not isinstance(doc, dict):
        raise InvalidInput("topology", type(doc).__name__, "a JSON object")
    extra = set(doc) - {"format", "components", "links"}
    if extra:
        key = sorted(extra)[0]
        raise InvalidInput(key, doc[key], "only the keys format, components, links")
    if doc.get("format") != FORMAT:
        raise InvalidInput("format", doc.get("format"), f"{FORMAT!r}")
    raw_comps = doc.get("components")
    if not isinstance(raw_comps, list):
        raise InvalidInput("components", raw_comps, "a list of component objects")
    raw_links = doc.get("links", [])
    if not isinstance(raw_links, list):
        raise InvalidInput("links", raw_links, "a list of link objects")
    kinds = {k.value: k for k in ComponentKind}
    comps: list[Component] = []
    for i, rc in enumerate(raw_comps):
        path = f"components[{i}]"
        if not isinstance(rc, dict):
            raise InvalidInput(path, rc, "an object with id, kind, parent, serial")
        _only(rc, path, {"id", "kind", "parent", "serial"})
        cid = _str(rc, "id", path)
        kind = rc.get("kind")
        if kind not in kinds:
            raise InvalidInput(f"{path}.kind", kind, f"one of {sorted(kinds)}")
        parent = rc.get("parent")
        if parent is not None and (not isinstance(parent, str) or not parent):
            raise InvalidInput(f"{path}.parent", parent, "a component id or null")
        serial = rc.get("serial", "")
        if not isinstance(serial, str):
            raise InvalidInput(f"{path}.serial", serial, "a string")
        comps.append(Component(cid, kinds[kind], parent, serial))
    links: list[Link] = []
    for i, rl in enumerate(raw_links):
        path = f"links[{i}]"
        if not isinstance(rl, dict):
            raise InvalidInput(path, rl, "an object with id, kind, a, b")
        _only(rl, path, {"id", "kind", "a", "b"})
        links.append(Link(_str(rl, "id", path), _str(rl, "kind", path), _str(rl, "a", path), _str(rl, "b", path)))
    return Topology.of(comps, links)


def dump_topology(topo: Topology) -> str:
    """The ``gpufleet.topology/v1`` JSON text of ``topo`` (one component or link per line)."""
    comp_lines = [
        json.dumps({"id": c.id, "kind": c.kind.value, "parent": c.parent, "serial": c.serial}, separators=(",", ":"))
        for c in topo.components.values()
    ]
    link_lines = [
        json.dumps({"id": ln.id, "kind": ln.kind, "a": ln.a, "b": ln.b}, separators=(",", ":"))
        for ln in topo.links.values()
    ]
    return (
        '{"format": "'
        + FORMAT
        + '",\n "components": [\n  '
        + ",\n  ".join(comp_lines)
        + '\n ],\n "links": [\n  '
        + ",\n  ".join(link_lines)
        + "\n ]}\n"
    )


def _only(obj: Mapping[str, Any], path: str, allowed: set[str]) -> None:
    for k in obj:
        if k not in allowed:
            raise InvalidInput(f"{path}.{k}", obj[k], f"only the fields {sorted(allowed)}")


def _str(obj: Mapping[str, Any], key: str, path: str) -> str:
    v = obj.get(key)
    if not isinstance(v, str) or not v:
        raise InvalidInput(f"{path}.{key}", v, "a non-empty string")
    return v
