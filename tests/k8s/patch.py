"""The three patch formats of the Kubernetes API, as the fake API server applies them.

* JSON patch (RFC 6902, ``application/json-patch+json``): add, remove, replace, test, move, copy.
* JSON merge patch (RFC 7386, ``application/merge-patch+json``): maps merge, ``null`` deletes, lists
  are replaced whole.
* Strategic merge patch (``application/strategic-merge-patch+json``): like a merge patch, except that
  lists the API declares with a ``patchMergeKey`` merge element by element on that key. Only the lists
  the adapter touches are declared here (from the Kubernetes API types: ``NodeStatus.conditions`` and
  ``NodeStatus.addresses`` merge on ``type``, ``PodSpec.containers`` on ``name``,
  ``ObjectMeta.ownerReferences`` on ``uid``). ``NodeSpec.taints`` carries no merge key in the API, so a
  strategic patch replaces the whole taint list — which is why the adapter always sends the full list
  together with the resourceVersion it read.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("spec", "containers"): "name",
    ("metadata", "ownerReferences"): "uid",
}


class PatchError(ValueError):
    """A patch that cannot be applied (422 from the fake), or a failed JSON-patch ``test`` (409)."""

    def __init__(self, message: str, *, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        here = (*path, key)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and here[-2:] in MERGE_KEYS:
            out[key] = _merge_list(out.get(key) or [], value, MERGE_KEYS[here[-2:]])
        else:
            out[key] = strategic_merge_patch(out.get(key), value, here)
    return out


def _merge_list(current: list[Any], patch: list[Any], key: str) -> list[Any]:
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"strategic merge patch: list item without its merge key {key!r}: {item!r}")
        if item.get("$patch") == "delete":
            merged = [m for m in merged if m.get(key) != item[key]]
            continue
        for i, m in enumerate(merged):
            if m.get(key) == item[key]:
                merged[i] = strategic_merge_patch(m, item)
                break
        else:
            merged.append(copy.deepcopy(item))
    return merged


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        kind, path = op.get("op"), _pointer(op.get("path", ""))
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"the JSON patch test at {op.get('path')} failed", code=409)
        elif kind in ("add", "replace"):
            if kind == "replace":
                _get(doc, path)
            doc = _set(doc, path, copy.deepcopy(op.get("value")), insert=kind == "add")
        elif kind == "remove":
            _get(doc, path)
            doc = _remove(doc, path)
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _set(doc, path, value, insert=True)
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"a JSON pointer starts with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _get(doc: Any, path: list[str]) -> Any:
    for part in path:
        if isinstance(doc, list):
            if not part.isdigit() or int(part) >= len(doc):
                raise PatchError(f"no element {part!r} in a list of {len(doc)}")
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            raise PatchError(f"the path element {part!r} does not exist")
    return doc


def _set(doc: Any, path: list[str], value: Any, *, insert: bool) -> Any:
    if not path:
        return value
    parent = _get(doc, path[:-1])
    last = path[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if insert:
            parent.insert(index, value)
        else:
            parent[index] = value
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise PatchError(f"cannot set {last!r} inside a {type(parent).__name__}")
    return doc


def _remove(doc: Any, path: list[str]) -> Any:
    parent = _get(doc, path[:-1])
    if isinstance(parent, list):
        del parent[int(path[-1])]
    else:
        del parent[path[-1]]
    return doc
