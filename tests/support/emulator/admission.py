"""Admission of custom resources as an API server does it: defaults, pruning, schema, CEL.

Why it exists: kvpool's CRDs carry their rules (schema and ``x-kubernetes-validations``);
the operator must never be the only check, so the emulator refuses what a real server
refuses - with a 422 naming every field path - using :mod:`kvpool.api.validation`, and
ratchets as a server does (a field already invalid and left unchanged passes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvpool.api.validation import Finding, check_extensions
from kvpool.api.validation.rules import UNEVALUATED
from kvpool.api.validation.schema import apply_defaults, check_value
from tests.support.emulator.resources import ApiResource, Obj, kube_error

TOP_LEVEL = ("apiVersion", "kind", "metadata")


def prune(schema: Mapping[str, Any], value: Any, path: str = "") -> tuple[Any, list[str]]:
    """``value`` without the fields its structural schema does not know (as the API server
    prunes them), and the paths removed. ``x-kubernetes-preserve-unknown-fields`` keeps a
    node as it is.

    >>> prune({"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": 1, "b": 2})
    ({'a': 1}, ['b'])
    """
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value, []
    removed: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not path and key in TOP_LEVEL:  # metadata is the server's, never pruned
                out[key] = item
                continue
            child = props.get(key) if props is not None else None
            if child is None and isinstance(extra, dict):
                child = extra
            if child is None:
                removed.append(where)
                continue
            out[key], gone = prune(child, item, where)
            removed += gone
        return out, removed
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = []
        for index, item in enumerate(value):
            kept, gone = prune(schema["items"], item, f"{path}[{index}]")
            items.append(kept)
            removed += gone
        return items, removed
    return value, removed


_MISSING = object()


def value_at(obj: Any, path: str) -> Any:
    """The value at a finding's path (``spec.tiers[0].floorPercent``), or a marker when
    absent; findings with an empty path name the whole object.

    >>> value_at({"spec": {"tiers": [{"floorPercent": 5}]}}, "spec.tiers[0].floorPercent")
    5
    """
    node: Any = obj
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        if name and isinstance(node, dict) and name in node:
            node = node[name]
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return _MISSING
    return node


def admission_findings(schema: Mapping[str, Any], obj: Obj) -> list[Finding]:
    """Schema and CEL findings for an already defaulted and pruned object."""
    body = {k: v for k, v in obj.items() if k not in TOP_LEVEL}
    findings = check_value(dict(schema), body)
    rules = check_extensions(dict(schema), body)
    if findings:  # rules over ill-typed data cannot be evaluated; the schema says why
        rules = [f for f in rules if UNEVALUATED not in f.reason]
    return findings + rules


def admit(
    resource: ApiResource,
    obj: Obj,
    field_validation: str | None,
    old: Obj | None = None,
) -> Obj:
    """Default, prune and validate a custom resource as the API server would.

    ``field_validation`` is the request's ``fieldValidation``: ``Strict`` refuses
    unknown fields, ``Warn``/``Ignore`` (and none) prune them; ``None`` from
    :meth:`store` skips admission altogether.
    """
    if resource.schema is None or field_validation == "skip":
        return obj
    defaulted = apply_defaults(dict(resource.schema), obj)
    pruned, unknown = prune(resource.schema, defaulted)
    findings = [Finding(path, "unknown field") for path in unknown]
    if field_validation != "Strict":
        findings = []
    findings += admission_findings(resource.schema, pruned)
    if old is not None:  # ratcheting: what was invalid and is unchanged stays allowed
        before, _ = prune(resource.schema, apply_defaults(dict(resource.schema), old))
        findings = [f for f in findings if value_at(pruned, f.path) != value_at(before, f.path)]
    if findings:
        name = (obj.get("metadata") or {}).get("name", "")
        causes = [
            {"reason": "FieldValueInvalid", "field": f.path, "message": f.reason} for f in findings
        ]
        details = "; ".join(f"{f.path}: {f.reason}" for f in findings)
        raise kube_error(
            422,
            "Invalid",
            f'{resource.kind}.{resource.group} "{name}" is invalid: {details}',
            name=name,
            group=resource.group,
            kind=resource.kind,
            causes=causes,
        )
    result: Obj = pruned
    return result
