"""The ``apiextensions.k8s.io/v1`` structural-schema rules a CRD's ``openAPIV3Schema`` must follow
(Kubernetes docs, "Extend the Kubernetes API with CustomResourceDefinitions" > "Specifying a structural
schema"), as a checker returning every violation with its path."""

from __future__ import annotations

from typing import Any

# JSONSchemaProps fields apiextensions/v1 rejects outright
FORBIDDEN = ("$ref", "definitions", "dependencies", "patternProperties", "id", "additionalItems", "$schema")
EXTENSIONS = ("x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")


def violations(schema: dict[str, Any], path: str = "openAPIV3Schema", *, root: bool = True) -> list[str]:
    out: list[str] = []
    for key in FORBIDDEN:
        if key in schema:
            out.append(f"{path}: {key} is not allowed")
    if schema.get("uniqueItems") is True:
        out.append(f"{path}: uniqueItems: true is not allowed")
    if not schema.get("type") and not any(schema.get(x) for x in EXTENSIONS):
        out.append(f"{path}: every schema needs a non-empty type")
    if root and schema.get("type") != "object":
        out.append(f"{path}: the root must be of type object")
    if "properties" in schema and "additionalProperties" in schema:
        out.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if schema.get("type") == "array":
        items = schema.get("items")
        if not isinstance(items, dict):
            out.append(f"{path}: an array needs exactly one items schema")
        else:
            out += violations(items, f"{path}.items", root=False)
    for name, sub in (schema.get("properties") or {}).items():
        if root and name == "metadata":
            extra = set(sub) - {"type", "properties"} or set(sub.get("properties", {})) - {"name", "generateName"}
            if extra:
                out.append(f"{path}.metadata: only metadata.name and generateName may be restricted ({extra})")
        out += violations(sub, f"{path}.properties.{name}", root=False)
    if isinstance(schema.get("additionalProperties"), dict):
        out += violations(schema["additionalProperties"], f"{path}.additionalProperties", root=False)
    for combinator in ("allOf", "anyOf", "oneOf", "not"):
        if combinator in schema:
            out.append(f"{path}: {combinator} is not checked here (gpufleet's schemas do not use it)")
    return out
