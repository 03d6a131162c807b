"""``GPUNode`` resources kept in step with the controller's store, and ``spec.maintenance`` read back.

The store is the source of truth; a ``GPUNode`` is a view of it (``kubectl get gpunodes`` shows the
fleet's lifecycle states, since when and why) plus a way in (``spec.maintenance: true`` asks for a drain
through gpufleet). :class:`GpuNodes` writes one object per node — created with an empty spec when
missing, its ``status`` subresource patched (JSON merge patch) only when what it shows changed since
this process last wrote it — and lists the nodes whose spec asks for maintenance. The controller's side
(which nodes, which states, what to do with a maintenance request) is ``controller/kubesync.py``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufleet.domain.errors import ExternalError
from gpufleet.schedulers.kubernetes.adapter import KubernetesScheduler
from gpufleet.schedulers.kubernetes.crd import (
    GROUP,
    VERSION,
    GPUNodeStatus,
    RemediationSpec,
    RemediationStatus,
    camel,
)

PLURAL = "gpunodes"
REMEDIATIONS = "remediations"


def to_doc(value: Any) -> Any:
    """A CRD dataclass as the API's JSON: camelCase keys, enum values, RFC 3339 times."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {camel(f.name): to_doc(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_doc(v) for v in value]
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return value


class GpuNodes:
    def __init__(self, adapter: KubernetesScheduler) -> None:
        self._adapter = adapter
        self._custom = k8s.CustomObjectsApi(adapter.api)
        self._shown: dict[str, Any] = {}  # node -> the status document last written by this process

    def publish(self, statuses: Mapping[str, GPUNodeStatus]) -> int:
        """Write each node's status where it changed; returns how many objects were written."""
        written = 0
        for node, status in sorted(statuses.items()):
            doc = to_doc(status)
            if self._shown.get(node) == doc:
                continue
            self._write_status(node, doc)
            self._shown[node] = doc
            written += 1
        return written

    def maintenance(self) -> dict[str, str]:
        """The nodes whose ``spec.maintenance`` is true, with the spec's ``reason``."""
        doc = cast("dict[str, Any]", self._adapter.call(
            partial(self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)))
        out = {}
        for item in doc.get("items", []):
            spec = item.get("spec") or {}
            if spec.get("maintenance") is True:
                out[str(item["metadata"]["name"])] = str(spec.get("reason") or "")
        return out

    def record(self, name: str, spec: RemediationSpec, status: RemediationStatus) -> None:
        """Create or update the ``Remediation`` ``name`` (an outbox action id made a resource name)."""
        self._write_status(resource_name(name), to_doc(status), plural=REMEDIATIONS, kind="Remediation",
                           spec=to_doc(spec))

    def _write_status(self, name: str, doc: Any, *, plural: str = PLURAL, kind: str = "GPUNode",
                      spec: Any = None) -> None:
        body = {"status": doc}
        for _ in range(2):
            try:
                self._adapter.call(partial(self._custom.patch_cluster_custom_object_status,
                                           GROUP, VERSION, plural, name, body))
                return
            except ApiException as err:
                if err.status != 404:
                    raise ExternalError("kubernetes", f"{kind} {name}: {err.status} {err.reason}") from None
            obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": {"name": name},
                   "spec": spec if spec is not None else {}}
            try:
                self._adapter.call(partial(self._custom.create_cluster_custom_object, GROUP, VERSION, plural, obj))
            except ApiException as err:
                if err.status != 409:  # created meanwhile by someone else: patch it
                    raise ExternalError("kubernetes", f"{kind} {name}: {err.status} {err.reason}") from None
        raise ExternalError("kubernetes", f"{kind} {name}: could not create it and write its status")


def resource_name(action_id: str) -> str:
    """An outbox action id (``d-0123abcd:drain``) as a resource name (lower case, '-' and '.' only)."""
    return re.sub(r"[^a-z0-9.-]+", "-", action_id.lower()).strip("-.")[:253]
