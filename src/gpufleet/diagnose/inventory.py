"""Inventory files that map PCI addresses to GPU index, slot and node.

Three forms are accepted (docs/diagnose.md, "Inventory"):

* TOML or JSON with one node::

      node = "r01-n03"
      [[gpu]]
      index = 0
      pci = "0000:18:00.0"
      slot = "r01-n03-gpu0"      # optional
      serial = "1654922006281"   # optional

* TOML or JSON with several nodes: ``[[nodes]]`` tables, each with ``id`` and a ``gpu`` array.
* The CSV that ``nvidia-smi --query-gpu=index,pci.bus_id,serial --format=csv`` prints (node unnamed).
"""

from __future__ import annotations

import csv
import io
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.diagnose.finding import normalise_pci
from gpufleet.diagnose.grouping import GpuRef
from gpufleet.domain.errors import InvalidInput


def load_inventory(path: str | Path) -> dict[str, GpuRef]:
    """Read ``path`` (TOML, JSON or nvidia-smi CSV) into a map from normalised PCI address."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInput("--inventory", str(path), "an existing TOML, JSON or nvidia-smi CSV file")
    text = p.read_text(encoding="utf-8", errors="replace")
    head = text.lstrip()[:200].lower()
    if head.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise InvalidInput("--inventory", str(path), f"valid JSON ({err})") from None
        return parse_inventory(doc)
    if head.startswith("index") and "pci.bus_id" in head:
        return _from_smi_csv(text)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InvalidInput("--inventory", str(path), f"valid TOML ({err})") from None
    return parse_inventory(doc)


def parse_inventory(doc: Mapping[str, Any]) -> dict[str, GpuRef]:
    """The map from a parsed TOML/JSON document (see the module docstring)."""
    out: dict[str, GpuRef] = {}
    if "nodes" in doc:
        nodes = doc["nodes"]
        if not isinstance(nodes, list):
            raise InvalidInput("nodes", nodes, "an array of node tables")
        for i, node in enumerate(nodes):
            if not isinstance(node, dict) or not isinstance(node.get("id"), str):
                raise InvalidInput(f"nodes[{i}].id", node, "a table with a string id")
            _gpus(node, node["id"], f"nodes[{i}]", out)
        return out
    node = doc.get("node", "")
    if not isinstance(node, str):
        raise InvalidInput("node", node, "a node name (string)")
    _gpus(doc, node, "", out)
    return out


def _gpus(table: Mapping[str, Any], node: str, path: str, out: dict[str, GpuRef]) -> None:
    gpus = table.get("gpu", [])
    prefix = f"{path}." if path else ""
    if not isinstance(gpus, list):
        raise InvalidInput(f"{prefix}gpu", gpus, "an array of [[gpu]] tables")
    for j, g in enumerate(gpus):
        where = f"{prefix}gpu[{j}]"
        if not isinstance(g, dict):
            raise InvalidInput(where, g, "a table with index and pci")
        pci = normalise_pci(str(g.get("pci", "")))
        if pci is None:
            raise InvalidInput(f"{where}.pci", g.get("pci"), "a PCI address such as 0000:18:00.0")
        index = g.get("index")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
            raise InvalidInput(f"{where}.index", index, "a non-negative integer")
        slot, serial = str(g.get("slot", "")), str(g.get("serial", ""))
        out[pci] = GpuRef(node=node, index=index, slot=slot, serial=serial)


def _from_smi_csv(text: str) -> dict[str, GpuRef]:
    out: dict[str, GpuRef] = {}
    rows = csv.reader(io.StringIO(text), skipinitialspace=True)
    header = [h.strip().lower() for h in next(rows)]
    col = {name: header.index(name) for name in ("index", "pci.bus_id", "serial") if name in header}
    for k, row in enumerate(rows, start=2):
        if not row:
            continue
        pci = normalise_pci(row[col["pci.bus_id"]])
        if pci is None:
            raise InvalidInput(f"line {k}.pci.bus_id", row[col["pci.bus_id"]], "a PCI bus id")
        try:
            index = int(row[col["index"]])
        except ValueError:
            raise InvalidInput(f"line {k}.index", row[col["index"]], "an integer") from None
        serial = row[col["serial"]].strip() if "serial" in col else ""
        out[pci] = GpuRef(node="", index=index, serial=serial)
    return out
