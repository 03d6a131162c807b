"""The ``GPUNode`` and ``Remediation`` custom resources: their shapes as frozen dataclasses built on the
domain's enums, and the CRD manifests generated from them (``python -m
gpufleet.schedulers.kubernetes.crd DIR`` writes ``deploy/helm/gpufleet/crds/``; a test keeps the
committed files equal to the generated ones).

* ``GPUNode`` (cluster-scoped, one per GPU node, ``kubectl get gpunodes``): ``status`` mirrors the
  controller's store (lifecycle state, since when, why, evidence, the correlator's verdicts); ``spec``
  is the operator's wish (``maintenance: true`` = drain it through gpufleet). The store stays the
  source of truth; the resource is a view of it plus a way in.
* ``Remediation`` (cluster-scoped): one per action the reconciler carries out (drain, requeue, resume,
  validate) with its outcome.

The schemas are structural (``apiextensions.k8s.io/v1``): every field has a type, objects list their
properties, arrays have one ``items`` schema, nothing uses ``$ref``.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpufleet.correlate.model import SuspectAction
from gpufleet.lifecycle.decisions import ActionKind
from gpufleet.lifecycle.states import NodeState

GROUP = "gpufleet.io"
VERSION = "v1alpha1"


class RemediationPhase(StrEnum):
    """The outbox's action statuses (controller.store.repo.ActionStatus; a test keeps them equal)."""

    PENDING = "pending"
    WAITING = "waiting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class VerdictView:
    component: str  # the blamed component's id (a slot), e.g. r01-n03-gpu5
    kind: str  # its component kind
    confidence: float
    action: SuspectAction


@dataclass(frozen=True, slots=True)
class GPUNodeSpec:
    maintenance: bool = False  # true: drain this node through gpufleet (and keep it out)
    reason: str = ""  # why, for the audit log


@dataclass(frozen=True, slots=True)
class GPUNodeStatus:
    state: NodeState | None = None
    since: datetime | None = None
    reason: str = ""
    evidence: tuple[str, ...] = ()  # event ids behind the current state
    verdicts: tuple[VerdictView, ...] = ()
    gpus: int = 0
    observed_generation: int = 0


@dataclass(frozen=True, slots=True)
class RemediationSpec:
    node: str
    action: ActionKind
    decision: str  # the decision id (also in the node's drain reason)
    reason: str = ""
    requested_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RemediationStatus:
    phase: RemediationPhase | None = None
    attempts: int = 0
    last_error: str = ""
    result: str = ""
    finished_at: datetime | None = None


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def schema_of(tp: Any) -> dict[str, Any]:
    """An OpenAPI v3 (structural) schema for a dataclass field type."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return {**schema_of(args[0]), "nullable": True} if len(args) == 1 else {"type": "string"}
    if typing.get_origin(tp) is tuple:
        return {"type": "array", "items": schema_of(typing.get_args(tp)[0])}
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return {"type": "string", "enum": [m.value for m in tp]}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return {"type": "object", "properties": {camel(f.name): schema_of(hints[f.name])
                                                 for f in dataclasses.fields(tp)}}
    simple = {str: {"type": "string"}, bool: {"type": "boolean"}, int: {"type": "integer", "format": "int64"},
              float: {"type": "number"}, datetime: {"type": "string", "format": "date-time"}}
    if tp in simple:
        return dict(simple[tp])
    raise TypeError(f"no schema for {tp!r}")


def _crd(kind: str, plural: str, short: list[str], spec: type, status: type,
         columns: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "gpufleet"}},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower(),
                      "shortNames": short, "categories": ["gpufleet"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [{"name": n, "type": t, "jsonPath": p} for n, t, p in columns],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                   "metadata": {"type": "object"},
                                   "spec": schema_of(spec), "status": schema_of(status)},
                }},
            }],
        },
    }


def crds() -> list[dict[str, Any]]:
    return [
        _crd("GPUNode", "gpunodes", ["gn"], GPUNodeSpec, GPUNodeStatus, [
            ("State", "string", ".status.state"), ("Since", "date", ".status.since"),
            ("Reason", "string", ".status.reason"), ("Maintenance", "boolean", ".spec.maintenance")]),
        _crd("Remediation", "remediations", ["rem"], RemediationSpec, RemediationStatus, [
            ("Node", "string", ".spec.node"), ("Action", "string", ".spec.action"),
            ("Phase", "string", ".status.phase"), ("Age", "date", ".metadata.creationTimestamp")]),
    ]


def main(argv: list[str]) -> int:
    import json

    out = Path(argv[0]) if argv else Path("deploy/helm/gpufleet/crds")
    out.mkdir(parents=True, exist_ok=True)
    for crd in crds():
        # JSON is YAML; one stable, reviewable rendering without a YAML dependency
        (out / f"{crd['metadata']['name']}.yaml").write_text(
            "# generated by `python -m gpufleet.schedulers.kubernetes.crd` from the domain types: do not edit\n"
            + json.dumps(crd, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
