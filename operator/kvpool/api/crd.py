"""CustomResourceDefinitions generated from the pydantic models.

The models in :mod:`kvpool.api` are the one source of truth; ``crds/*.yaml`` is their
rendering, regenerated with ``kvpool crds --out-dir crds/`` (``make crds``) and checked
for drift by a test. A real API server accepts only *structural* schemas (every node
typed, no ``$ref``, no ``additionalProperties`` beside ``properties``, unions only as the
int-or-string extension), so pydantic's JSON Schema is rewritten node by node:

- ``$ref`` is inlined; a reference's own description (the field's) wins over the class
  docstring of the referenced model;
- ``anyOf [X, null]`` (an optional field) becomes ``X``; ``anyOf [integer, string]``
  becomes ``x-kubernetes-int-or-string: true``;
- ``title`` and pydantic's ``additionalProperties: false`` are dropped (the API server
  prunes unknown fields; ``kvpool validate`` reports them);
- ``const`` becomes a one-value ``enum``; the draft-2020 numeric ``exclusiveMinimum``
  becomes OpenAPI 3.0's ``minimum`` plus ``exclusiveMinimum: true``;
- ``default: null`` is dropped, other JSON defaults are kept (``lendPercent: 100``).

Worked example: ``kv_tokens_per_replica: int | None = Field(default=None, ge=1, ...)``
arrives as ``{anyOf: [{type: integer, minimum: 1}, {type: null}], default: null,
title: ..., description: ...}`` and leaves as ``{type: integer, minimum: 1,
description: ...}``.

:func:`assess_structural_schema` is the independent check that the result is structural.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml
from pydantic import BaseModel

from kvpool.api.common import CATEGORY, GROUP, VERSION
from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy

Schema = dict[str, Any]

GENERATED_HEADER = (
    "# Generated from operator/kvpool/api by `kvpool crds --out-dir crds/` (make crds).\n"
    "# Do not edit: change the pydantic models and regenerate.\n"
)


@dataclass(frozen=True)
class PrinterColumn:
    """One ``additionalPrinterColumns`` entry of ``kubectl get``."""

    name: str  # column header
    type: str  # integer, number, string, boolean or date
    json_path: str  # JSONPath into the object
    description: str  # shown by `kubectl explain`-like tools
    priority: int = 0  # 0 = shown by default; 1 = only with -o wide


@dataclass(frozen=True)
class CrdKind:
    """What a CRD needs beyond the schema: names and printer columns."""

    kind: str  # e.g. ModelPool
    plural: str  # e.g. modelpools (also the file name in crds/)
    short_name: str  # e.g. mp
    model: type[BaseModel]  # the pydantic model of the whole object
    columns: tuple[PrinterColumn, ...]  # extra `kubectl get` columns (Age is appended)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


_AGE = PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation.")

CRD_KINDS: tuple[CrdKind, ...] = (
    CrdKind(
        kind="ModelPool",
        plural="modelpools",
        short_name="mp",
        model=ModelPool,
        columns=(
            PrinterColumn("Ready", "integer", ".status.replicas.ready", "Ready engine replicas."),
            PrinterColumn("Warm", "integer", ".status.plan.replicas", "Warm replicas planned."),
            PrinterColumn(
                "KV/Replica",
                "integer",
                ".status.capacity.kvTokensPerReplica",
                "KV tokens one replica holds.",
            ),
            PrinterColumn(
                "Top Tier Floor",
                "integer",
                ".status.plan.tiers[0].floorTokens",
                "KV tokens guaranteed to the policy's first (highest-priority) tier, whatever "
                "its name.",
            ),
            PrinterColumn("Phase", "string", ".status.phase", "Pool phase at a glance."),
            PrinterColumn(
                "Revision", "string", ".status.rollout.stableRevision", "Stable engine revision."
            ),
            PrinterColumn(
                "Rollout",
                "string",
                ".status.rollout.phase",
                "Rollout phase: Idle, Progressing, Paused, Promoted or Aborted.",
            ),
        ),
    ),
    CrdKind(
        kind="TierPolicy",
        plural="tierpolicies",
        short_name="tp",
        model=TierPolicy,
        columns=(
            PrinterColumn("Top Tier", "string", ".spec.tiers[0].name", "Highest-priority tier."),
            PrinterColumn("Pools", "integer", ".status.pools", "ModelPools using this policy."),
            PrinterColumn(
                "Ready",
                "string",
                '.status.conditions[?(@.type=="Ready")].status',
                "Ready condition.",
            ),
        ),
    ),
    CrdKind(
        kind="TenantBudget",
        plural="tenantbudgets",
        short_name="tb",
        model=TenantBudget,
        columns=(
            PrinterColumn("Tenant", "string", ".spec.tenant", "Tenant id."),
            PrinterColumn("Tiers", "string", ".spec.tiers", "Tiers the tenant may use."),
            PrinterColumn("Over Budget", "string", ".spec.overBudget", "Reject or Demote."),
            # shown by default: `kubectl get kvpool -A` must show a tenant whose key is broken
            PrinterColumn(
                "Ready",
                "string",
                '.status.conditions[?(@.type=="Ready")].status',
                "Ready condition (False: the tenant is not served, see its conditions).",
            ),
        ),
    ),
)

_TOP_LEVEL: dict[str, Schema] = {
    "apiVersion": {
        "type": "string",
        "description": (
            "APIVersion defines the versioned schema of this representation of an object."
        ),
    },
    "kind": {
        "type": "string",
        "description": "Kind is a string value representing the REST resource of this object.",
    },
    "metadata": {"type": "object"},
}

_DROPPED_KEYS = frozenset({"title", "$defs"})
# Emitted key order, for readable YAML: what a node is, then its bounds, then its children.
_KEY_ORDER = {"type": 0, "x-kubernetes-int-or-string": 0, "description": 1, "default": 2}
_KEY_ORDER |= {"properties": 90, "required": 91, "items": 92, "additionalProperties": 93}
_KEY_ORDER |= {"x-kubernetes-list-type": 94, "x-kubernetes-list-map-keys": 95}
_KEY_ORDER |= {"x-kubernetes-validations": 96}


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline a ``$ref`` (or a one-element ``allOf``), the referring node's keys winning."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **siblings}, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        siblings = {k: v for k, v in node.items() if k != "allOf"}
        return _resolve({**node["allOf"][0], **siblings}, defs)
    return node


def _collapse_union(node: Schema, defs: dict[str, Schema]) -> Schema:
    """``anyOf [X, null]`` -> X; ``anyOf [integer, string]`` -> int-or-string."""
    options = [_resolve(o, defs) for o in node["anyOf"]]
    siblings = {k: v for k, v in node.items() if k != "anyOf"}
    non_null = [o for o in options if o.get("type") != "null"]
    if siblings.get("default", 0) is None:
        del siblings["default"]
    if len(non_null) == 1:
        return _resolve({**non_null[0], **siblings}, defs)
    if sorted(o.get("type", "") for o in non_null) == ["integer", "string"]:
        return {"x-kubernetes-int-or-string": True, **siblings}
    raise ValueError(f"a union a structural schema cannot express: {node}")


def build_structural_schema(node: Schema, defs: dict[str, Schema]) -> Schema:
    """One pydantic JSON Schema node (with its ``$defs``) as a structural schema node."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        node = _collapse_union(node, defs)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "additionalProperties" and (value is False or "properties" in node):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "properties":
            out[key] = {k: build_structural_schema(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = build_structural_schema(value, defs)
        else:
            out[key] = copy.deepcopy(value)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return dict(sorted(out.items(), key=lambda item: _KEY_ORDER.get(item[0], 50)))


def build_object_schema(model: type[BaseModel]) -> Schema:
    """The ``openAPIV3Schema`` of a whole custom resource (apiVersion, kind, metadata, ...)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema = build_structural_schema(raw, defs)
    properties = dict(schema["properties"])
    properties.update(copy.deepcopy(_TOP_LEVEL))
    schema["properties"] = {
        name: properties[name] for name in ("apiVersion", "kind", "metadata", "spec", "status")
    }
    schema["required"] = ["spec"]
    return schema


def build_crd(kind: CrdKind) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of one kind."""
    columns = [*kind.columns, _AGE]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": [kind.short_name],
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {
                            "name": c.name,
                            "type": c.type,
                            "jsonPath": c.json_path,
                            "description": c.description,
                            **({"priority": c.priority} if c.priority else {}),
                        }
                        for c in columns
                    ],
                    "schema": {"openAPIV3Schema": build_object_schema(kind.model)},
                }
            ],
        },
    }


def build_crds() -> list[dict[str, Any]]:
    """All kvpool CRDs, in the order of :data:`CRD_KINDS`."""
    return [build_crd(kind) for kind in CRD_KINDS]


def crd_kind(kind: str) -> CrdKind | None:
    """The :class:`CrdKind` of a kind name, or None when kvpool does not define it."""
    return next((k for k in CRD_KINDS if k.kind == kind), None)


@cache
def object_schema(kind: str) -> Schema:
    """The cached ``openAPIV3Schema`` of a kvpool kind (shared: do not modify it)."""
    info = crd_kind(kind)
    if info is None:
        raise KeyError(f"not a kvpool kind: {kind}")
    schema: Schema = build_crd(info)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def render_crd_yaml(crd: dict[str, Any]) -> str:
    """One CRD as the YAML written to ``crds/<plural>.yaml`` (header comment included)."""
    body = yaml.safe_dump(crd, sort_keys=False, width=100, allow_unicode=True)
    return GENERATED_HEADER + "---\n" + body


# --- the structural-schema check -------------------------------------------------------------

_ALLOWED_KEYS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "enum",
        "default",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "multipleOf",
        "uniqueItems",
        "nullable",
        "x-kubernetes-validations",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-embedded-resource",
    }
)
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})


def assess_structural_schema(node: Schema, path: str = "") -> list[str]:
    """Why a schema is not structural (plus our own rule: every property is described).

    Returns one message per offence; an empty list means structural.

    >>> assess_structural_schema({"type": "object", "properties": {"a": {"$ref": "#/x"}}})
    ['.a: no description', '.a: key $ref is not allowed', '.a: no type']
    """
    problems = [
        f"{path or '.'}: key {key} is not allowed" for key in node if key not in _ALLOWED_KEYS
    ]
    kind = node.get("type")
    if node.get("x-kubernetes-int-or-string") is True:
        if kind is not None:
            problems.append(f"{path or '.'}: int-or-string must not have a type")
    elif kind not in _TYPES and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path or '.'}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path or '.'}: additionalProperties beside properties")
    if kind == "array" and not isinstance(node.get("items"), dict):
        problems.append(f"{path or '.'}: array without items")
    if "default" in node and node["default"] is None:
        problems.append(f"{path or '.'}: null default")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not isinstance(node[key], bool):
            problems.append(f"{path or '.'}: {key} must be a boolean in OpenAPI v3.0")
    for name, child in node.get("properties", {}).items():
        child_path = f"{path}.{name}"
        if "description" not in child and child_path != ".metadata":
            problems.append(f"{child_path}: no description")
        problems.extend(assess_structural_schema(child, child_path))
    if isinstance(node.get("items"), dict):
        problems.extend(assess_structural_schema(node["items"], f"{path}[*]"))
    if isinstance(node.get("additionalProperties"), dict):
        problems.extend(assess_structural_schema(node["additionalProperties"], f"{path}.*"))
    return problems
