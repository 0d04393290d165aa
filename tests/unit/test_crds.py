"""The generated CRDs: committed files match the models, schemas are structural, and
kubernetes-validate (strict) accepts the CRD objects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvpool.api.common import API_VERSION, GROUP, VERSION
from kvpool.api.crd import (
    CRD_KINDS,
    CrdKind,
    assess_structural_schema,
    build_crd,
    build_crds,
    build_structural_schema,
    render_crd_yaml,
)
from kvpool.cli import main

CRDS_DIR = Path(__file__).resolve().parents[2] / "crds"
KINDS = {kind.kind: kind for kind in CRD_KINDS}


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _node(kind: str, path: str) -> dict[str, Any]:
    """The schema node at a dotted path; ``[]`` steps into list items."""
    node = _schema(build_crd(KINDS[kind]))
    for part in path.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


@pytest.mark.parametrize("kind", CRD_KINDS, ids=[k.plural for k in CRD_KINDS])
def test_committed_crd_matches_the_models(kind: CrdKind) -> None:
    committed = (CRDS_DIR / f"{kind.plural}.yaml").read_text(encoding="utf-8")

    assert committed == render_crd_yaml(build_crd(kind)), (
        f"crds/{kind.plural}.yaml is out of date with operator/kvpool/api: run make crds"
    )


@pytest.mark.parametrize("kind", CRD_KINDS, ids=[k.plural for k in CRD_KINDS])
def test_schema_is_structural(kind: CrdKind) -> None:
    assert assess_structural_schema(_schema(build_crd(kind))) == []


@pytest.mark.parametrize("kind", CRD_KINDS, ids=[k.plural for k in CRD_KINDS])
def test_kubernetes_validate_accepts_the_crd(kind: CrdKind) -> None:
    crd = build_crd(kind)

    version = kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)

    assert version


def test_kubernetes_validate_is_strict_about_crds() -> None:
    crd = build_crd(KINDS["ModelPool"])
    _schema(crd)["properties"]["spec"]["title"] = "not a JSONSchemaProps field in strict mode"
    _schema(crd)["properties"]["spec"]["exclusiveMinimum"] = 0

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def _typed(**extra: Any) -> dict[str, Any]:
    return {"type": "object", "description": "d", "properties": {"a": extra}}


NOT_STRUCTURAL = {
    "ref": (_typed(type="string", description="d", **{"$ref": "#/x"}), ".a: key $ref"),
    "untyped": (_typed(description="d"), ".a: no type"),
    "undescribed": (_typed(type="string"), ".a: no description"),
    "title": (_typed(type="string", description="d", title="A"), ".a: key title"),
    "props-and-additional": (
        {
            "type": "object",
            "properties": {"a": {"type": "string", "description": "d"}},
            "additionalProperties": {"type": "string"},
        },
        ".: additionalProperties beside properties",
    ),
    "union": (
        _typed(description="d", anyOf=[{"type": "string"}, {"type": "null"}]),
        ".a: key anyOf",
    ),
    "numeric-exclusive-minimum": (
        _typed(type="number", description="d", exclusiveMinimum=0),
        ".a: exclusiveMinimum must be a boolean",
    ),
    "array-without-items": (_typed(type="array", description="d"), ".a: array without items"),
    "null-default": (_typed(type="string", description="d", default=None), ".a: null default"),
    "typed-int-or-string": (
        _typed(type="string", description="d", **{"x-kubernetes-int-or-string": True}),
        ".a: int-or-string must not have a type",
    ),
    "nested-in-items": (
        _typed(type="array", description="d", items={"type": "object", "properties": {"b": {}}}),
        ".a[*].b: no type",
    ),
}


@pytest.mark.parametrize(("schema", "expected"), NOT_STRUCTURAL.values(), ids=NOT_STRUCTURAL.keys())
def test_structural_checker_finds(schema: dict[str, Any], expected: str) -> None:
    problems = assess_structural_schema(schema)

    assert any(p.startswith(expected) for p in problems), problems


TRANSLATED = {
    "int-or-string-map": (
        "ModelPool",
        "spec.engine.resources.limits",
        {
            "type": "object",
            "additionalProperties": {"x-kubernetes-int-or-string": True, "type": None},
        },
    ),
    "string-map": (
        "ModelPool",
        "spec.engine.nodeSelector",
        {"type": "object", "additionalProperties": {"type": "string"}},
    ),
    "int-map-with-bound": (
        "ModelPool",
        "spec.capacity.peakConcurrency",
        {"additionalProperties": {"type": "integer", "minimum": 0}},
    ),
    "default-port": ("ModelPool", "spec.engine.port", {"type": "integer", "default": 8000}),
    "default-lend-percent": (
        "TierPolicy",
        "spec.tiers.[].lendPercent",
        {"default": 100, "minimum": 0, "maximum": 100},
    ),
    "optional-collapsed": (
        "ModelPool",
        "spec.capacity.kvTokensPerReplica",
        {"type": "integer", "minimum": 1, "anyOf": None, "default": None},
    ),
    "gt-as-exclusive-minimum": (
        "ModelPool",
        "spec.rollout.gates.minKVCapacityRatio",
        {"type": "number", "minimum": 0, "exclusiveMinimum": True},
    ),
    "enum": ("TenantBudget", "spec.overBudget", {"enum": ["Reject", "Demote"]}),
    "pattern": ("TenantBudget", "spec.limits.[].window", {"pattern": "^[1-9][0-9]{0,6}(s|m|h|d)$"}),
    "list-map": (
        "TenantBudget",
        "spec.limits",
        {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["window"]},
    ),
    "list-set": ("ModelPool", "spec.rollout.canaryTiers", {"x-kubernetes-list-type": "set"}),
    "class-docstring-on-object": (
        "TierPolicy",
        "spec.tiers.[]",
        {"description": "One priority tier. Tiers are listed highest priority first."},
    ),
    "field-description-wins": (
        "ModelPool",
        "spec.rollout.gates",
        {"description": "Promotion gates."},
    ),
    "status-kept": ("ModelPool", "status.plan.tiers.[].floorTokens", {"type": "integer"}),
    "metadata-opaque": ("TierPolicy", "metadata", {"type": "object", "properties": None}),
}


@pytest.mark.parametrize(("kind", "path", "expected"), TRANSLATED.values(), ids=TRANSLATED.keys())
def test_schema_translation(kind: str, path: str, expected: dict[str, Any]) -> None:
    node = _node(kind, path)

    assert _pick(node, expected) == expected


def _pick(node: Any, expected: Any) -> Any:
    """The part of ``node`` that ``expected`` talks about (None stands for absent)."""
    if not isinstance(expected, dict) or not isinstance(node, dict):
        return node
    return {key: _pick(node.get(key), value) for key, value in expected.items()}


def test_cel_rules_keep_their_field_path() -> None:
    rules = _node("TierPolicy", "spec")["x-kubernetes-validations"]

    assert {(r["fieldPath"], r["message"]) for r in rules} >= {
        (".tiers", "tier names must be unique"),
        (".tiers", "the floors of all tiers (floorPercent) must sum to at most 100"),
    }


NAMES = {
    "ModelPool": ("modelpools.kvpool.dev", "modelpools", "mp"),
    "TierPolicy": ("tierpolicies.kvpool.dev", "tierpolicies", "tp"),
    "TenantBudget": ("tenantbudgets.kvpool.dev", "tenantbudgets", "tb"),
}


@pytest.mark.parametrize(("kind", "names"), NAMES.items(), ids=NAMES.keys())
def test_names_scope_and_version(kind: str, names: tuple[str, str, str]) -> None:
    crd = build_crd(KINDS[kind])
    (version,) = crd["spec"]["versions"]

    assert (crd["metadata"]["name"], crd["spec"]["names"]["plural"]) == names[:2]
    assert crd["spec"]["names"]["shortNames"] == [names[2]]
    assert crd["spec"]["names"]["categories"] == ["kvpool"]
    assert (crd["spec"]["group"], crd["spec"]["scope"]) == ("kvpool.dev", "Namespaced")
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


COLUMNS = {
    "ModelPool": [
        ("Ready", ".status.replicas.ready"),
        ("Warm", ".status.plan.replicas"),
        ("KV/Replica", ".status.capacity.kvTokensPerReplica"),
        ("Top Tier Floor", ".status.plan.tiers[0].floorTokens"),
        ("Phase", ".status.phase"),
        ("Revision", ".status.rollout.stableRevision"),
        ("Rollout", ".status.rollout.phase"),
        ("Age", ".metadata.creationTimestamp"),
    ],
    "TierPolicy": [
        ("Top Tier", ".spec.tiers[0].name"),
        ("Pools", ".status.pools"),
        ("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        ("Age", ".metadata.creationTimestamp"),
    ],
    "TenantBudget": [
        ("Tenant", ".spec.tenant"),
        ("Tiers", ".spec.tiers"),
        ("Over Budget", ".spec.overBudget"),
        ("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        ("Age", ".metadata.creationTimestamp"),
    ],
}


@pytest.mark.parametrize(("kind", "columns"), COLUMNS.items(), ids=COLUMNS.keys())
def test_printer_columns(kind: str, columns: list[tuple[str, str]]) -> None:
    (version,) = build_crd(KINDS[kind])["spec"]["versions"]

    assert [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]] == columns


def test_every_ready_column_is_shown_by_default() -> None:
    """``kubectl get kvpool -A`` shows only priority-0 columns: a tenant whose key is
    broken (Ready False) must not look fine there."""
    for kind in KINDS.values():
        (version,) = build_crd(kind)["spec"]["versions"]
        ready = [c for c in version["additionalPrinterColumns"] if c["name"] == "Ready"]
        assert ready and all(c.get("priority", 0) == 0 for c in ready), kind.kind


def _walk_json_path(schema: dict[str, Any], json_path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for part in json_path.strip(".").split("."):
        name = part.split("[")[0]
        if node is None or name not in node.get("properties", {}):
            return None
        node = node["properties"][name]
        if "[" in part:
            node = node.get("items")
    return node


@pytest.mark.parametrize("kind", CRD_KINDS, ids=[k.plural for k in CRD_KINDS])
def test_printer_columns_point_at_fields_of_their_type(kind: CrdKind) -> None:
    crd = build_crd(kind)
    (version,) = crd["spec"]["versions"]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata") or "?(" in column["jsonPath"]:
            continue
        node = _walk_json_path(_schema(crd), column["jsonPath"])
        assert node is not None, column
        if column["type"] == "integer":
            assert node["type"] == "integer", column


def test_cli_prints_all_crds(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["crds"])
    out, _ = capsys.readouterr()

    assert code == 0
    assert list(yaml.safe_load_all(out)) == build_crds()


def test_cli_writes_one_file_per_crd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["crds", "--out-dir", str(tmp_path / "out")])
    capsys.readouterr()

    written = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "out").iterdir()}
    assert code == 0
    assert written == {f"{k.plural}.yaml": render_crd_yaml(build_crd(k)) for k in CRD_KINDS}


def test_generation_does_not_share_state() -> None:
    first = build_crds()
    mutated = copy.deepcopy(first)
    _schema(mutated[0])["properties"].clear()

    assert build_crds() == first


def test_a_union_no_structural_schema_can_express_is_refused() -> None:
    from pydantic import BaseModel, Field

    class Odd(BaseModel):
        """A model with a list-or-integer field."""

        value: int | list[int] = Field(description="Either.")

    raw = Odd.model_json_schema()

    with pytest.raises(ValueError, match="a union a structural schema cannot express"):
        build_structural_schema(raw, raw.get("$defs", {}))


def test_the_api_version_is_group_slash_version() -> None:
    assert f"{GROUP}/{VERSION}" == API_VERSION, (API_VERSION, GROUP, VERSION)
