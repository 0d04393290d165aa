"""Validate a set of loaded YAML documents: each object alone, then the set as a whole.

Per document, in the order an API server would work (and then some):

1. it is a mapping with ``apiVersion``, ``kind`` and ``metadata.name``;
2. kvpool kinds: defaults from the schema, OpenAPI schema (unknown fields included),
   CEL rules and list types (:mod:`.schema`, :mod:`.rules`); then, when those pass, the
   pydantic model and the checks no schema can express (:mod:`.semantic`);
3. the built-ins that ship beside them (v1 Secret, ConfigMap, Namespace) go to the
   ``check_builtin`` function the caller passes (the CLI uses kubernetes-validate, which
   reads its schemas from disk, so it cannot live in this pure layer);
4. any other kind (a Deployment, a HelmRelease, an ExternalSecret...) and every document of
   a kustomization or Docker Compose file is :class:`Skipped`: a GitOps repository holds
   them beside kvpool's objects. Only an unknown kind of kvpool's own group is a problem
   (a typo there would otherwise pass unnoticed).

Then references across the valid objects (:mod:`.references`). A reference to an object
that is in the set but invalid is not reported again (its own problems say what is wrong),
so one bad TierPolicy gives its own lines, not one more per pool and tenant using it. No
file I/O happens here: the caller loads :class:`Document` values, so the operator can
reuse the checks.

Worked example: a document ``[1, 2]`` in ``a.yaml`` gives
``a.yaml: document 1: not a Kubernetes object (a list, not a mapping)``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from kvpool.api.common import API_VERSION, GROUP
from kvpool.api.crd import crd_kind, object_schema
from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.api.validation import semantic
from kvpool.api.validation.references import KeyDigest, Located, check_references
from kvpool.api.validation.results import (
    DEFAULT_NAMESPACE,
    Document,
    Finding,
    Problem,
    SecretData,
    Skipped,
    ValidatedSet,
)
from kvpool.api.validation.rules import UNEVALUATED, check_extensions
from kvpool.api.validation.schema import apply_defaults, check_schema, format_path

BuiltinCheck = Callable[[Mapping[str, Any]], list[Finding]]

BUILTIN_KINDS = frozenset({("v1", "Secret"), ("v1", "ConfigMap"), ("v1", "Namespace")})
KVPOOL_KINDS = "ModelPool, TierPolicy, TenantBudget"
# files whose documents are build or run instructions, not objects to apply: kustomize's
# and Docker Compose's (by their file names)
INSTRUCTION_FILES = {
    "kustomization.yaml": "kustomization file",
    "kustomization.yml": "kustomization file",
    "Kustomization": "kustomization file",
    "compose.yaml": "compose file",
    "compose.yml": "compose file",
    "docker-compose.yaml": "compose file",
    "docker-compose.yml": "compose file",
}

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MODELS: dict[str, type[BaseModel]] = {
    "ModelPool": ModelPool,
    "TierPolicy": TierPolicy,
    "TenantBudget": TenantBudget,
}


def _type_name(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", int: "a number"}
    return names.get(type(value), f"a {type(value).__name__}")


def check_metadata(body: Mapping[str, Any], namespaced: bool = True) -> list[Finding]:
    """``metadata.name`` (a DNS subdomain) and ``metadata.namespace`` (a DNS label)."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict):
        return [Finding("metadata", "required: a mapping with at least a name")]
    findings = []
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        findings.append(Finding("metadata.name", "required field is missing"))
    elif len(name) > 253 or not _SUBDOMAIN.match(name):
        findings.append(
            Finding(
                "metadata.name",
                f"{name!r} is not a valid name (lower-case letters, digits, '-' and '.', "
                "at most 253 characters)",
            )
        )
    namespace = metadata.get("namespace")
    if namespace is not None and not namespaced:
        findings.append(Finding("metadata.namespace", "this kind is not namespaced"))
    elif namespace is not None and (
        not isinstance(namespace, str) or len(namespace) > 63 or not _LABEL.match(namespace)
    ):
        findings.append(Finding("metadata.namespace", f"{namespace!r} is not a DNS label"))
    return findings


def _pydantic_findings(error: ValidationError) -> list[Finding]:
    return [
        Finding(format_path([p for p in e["loc"] if isinstance(p, str | int)]), e["msg"])
        for e in error.errors()
    ]


def check_custom_object(body: Mapping[str, Any]) -> tuple[BaseModel | None, list[Finding]]:
    """The parsed model of a kvpool object (None when invalid) and every finding."""
    kind = str(body.get("kind"))
    info = crd_kind(kind)
    if info is None:
        raise ValueError(f"not a kvpool kind: {kind}")
    findings = check_metadata(body)
    schema = object_schema(info.kind)
    defaulted = apply_defaults(schema, dict(body))
    schema_findings = check_schema(kind, defaulted)
    rule_findings = semantic.explain_rule_findings(defaulted, check_extensions(schema, defaulted))
    if schema_findings:
        # Rules over ill-typed data cannot be evaluated; the schema finding says why.
        rule_findings = [f for f in rule_findings if UNEVALUATED not in f.reason]
    findings += schema_findings + rule_findings
    if findings:
        return None, findings
    try:
        model = _MODELS[kind].model_validate(body)
    except ValidationError as error:
        return None, _pydantic_findings(error)
    if isinstance(model, ModelPool):
        findings = semantic.check_model_pool(model)
    elif isinstance(model, TierPolicy):
        findings = semantic.check_tier_policy(model)
    elif isinstance(model, TenantBudget):
        findings = semantic.check_tenant_budget(model)
    return (None if findings else model), findings


def build_secret_data(body: Mapping[str, Any]) -> tuple[SecretData | None, list[Finding]]:
    """A Secret's decoded values; ``data`` values must be base64."""
    metadata = body.get("metadata") or {}
    values: dict[str, str] = {}
    findings = []
    data = body.get("data") or {}
    string_data = body.get("stringData") or {}
    if not isinstance(data, dict) or not isinstance(string_data, dict):
        return None, [Finding("data", "data and stringData must be mappings")]
    for key, value in data.items():
        try:
            values[str(key)] = base64.b64decode(str(value), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            findings.append(Finding(f"data.{key}", "not valid base64 of UTF-8 text"))
    values.update({str(k): str(v) for k, v in string_data.items()})
    secret = SecretData(
        name=str(metadata.get("name")),
        namespace=str(metadata.get("namespace") or DEFAULT_NAMESPACE),
        values=values,
        labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
    )
    return secret, findings


_Valid = ModelPool | TierPolicy | TenantBudget | SecretData | Mapping[str, Any]


def _file_name(source: str) -> str:
    return source.replace("\\", "/").rsplit("/", 1)[-1]


def check_document(
    doc: Document, check_builtin: BuiltinCheck | None = None
) -> tuple[_Valid | Skipped | None, list[Problem]]:
    """One document: the valid object it holds (None when it has problems, a
    :class:`Skipped` when kvpool does not check it) and its problems."""
    body = doc.body
    instructions = INSTRUCTION_FILES.get(_file_name(doc.source))
    if instructions is not None:
        return Skipped(doc.source, instructions), []
    if not isinstance(body, dict):
        reason = f"not a Kubernetes object ({_type_name(body)}, not a mapping)"
        return None, [Problem(doc.source, "", "", f"document {doc.index}", reason)]
    kind, api_version = body.get("kind"), body.get("apiVersion")
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    label = (str(kind) if kind else "", str(name) if name else "")

    def located(findings: list[Finding]) -> list[Problem]:
        return [Problem(doc.source, *label, f.path, f.reason) for f in findings]

    if not isinstance(kind, str) or not isinstance(api_version, str):
        missing = "kind" if not isinstance(kind, str) else "apiVersion"
        path = missing if any(label) else f"document {doc.index}: {missing}"
        return None, [Problem(doc.source, *label, path, "required field is missing")]
    if crd_kind(kind) is not None and api_version.split("/")[0] == GROUP:
        if api_version != API_VERSION:
            reason = f"{api_version} is not served; use {API_VERSION}"
            return None, located([Finding("apiVersion", reason)])
        model, findings = check_custom_object(body)
        typed = model if isinstance(model, ModelPool | TierPolicy | TenantBudget) else None
        return typed, located(findings)
    if (api_version, kind) in BUILTIN_KINDS:
        findings = check_metadata(body, namespaced=kind != "Namespace")
        findings += check_builtin(body) if check_builtin is not None else []
        valid: _Valid = body
        if kind == "Secret":
            secret, secret_findings = build_secret_data(body)
            findings += secret_findings
            valid = secret if secret is not None else body
        return (None if findings else valid), located(findings)
    if api_version.split("/")[0] == GROUP:
        reason = f"{kind!r} is not a kind of {GROUP} (kinds: {KVPOOL_KINDS})"
        return None, located([Finding("kind", reason)])
    return Skipped(doc.source, f"{api_version} {kind}/{label[1] or '?'}"), []


def validate_documents(
    documents: Iterable[Document],
    check_builtin: BuiltinCheck | None = None,
    key_digest: KeyDigest | None = None,
) -> ValidatedSet:
    """Check every document and the references between them; see the module docstring.

    ``key_digest`` is how API keys are compared for "one key, one tenant" (the command
    passes the gateway's :func:`kvpool.domain.api_keys.api_key_digest`; without it, exact
    values are compared).

    Empty documents (a trailing ``---``) are skipped; problems come in document order,
    then the problems across objects.
    """
    problems: list[Problem] = []
    pools: list[Located[ModelPool]] = []
    policies: list[Located[TierPolicy]] = []
    budgets: list[Located[TenantBudget]] = []
    secrets: list[SecretData] = []
    others: list[Mapping[str, Any]] = []
    skipped: list[Skipped] = []
    invalid: set[tuple[str, str, str]] = set()  # (kind, namespace, name) in the set, not valid
    for doc in documents:
        if doc.body is None:
            continue
        valid, found = check_document(doc, check_builtin)
        problems.extend(found)
        if valid is None and isinstance(doc.body, dict):
            invalid.add(_identity(doc.body))
        if isinstance(valid, Skipped):
            skipped.append(valid)
        elif isinstance(valid, ModelPool):
            pools.append(Located(doc.source, valid))
        elif isinstance(valid, TierPolicy):
            policies.append(Located(doc.source, valid))
        elif isinstance(valid, TenantBudget):
            budgets.append(Located(doc.source, valid))
        elif isinstance(valid, SecretData):
            secrets.append(valid)
        elif valid is not None:
            others.append(valid)
    references = check_references(pools, policies, budgets, secrets, invalid, key_digest)
    return ValidatedSet(
        pools=[p.obj for p in pools],
        tier_policies=[p.obj for p in policies],
        tenant_budgets=[b.obj for b in budgets],
        secrets=secrets,
        others=others,
        problems=[*problems, *references.problems],
        warnings=references.warnings,
        skipped=skipped,
    )


def _identity(body: Mapping[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name) of a document, as far as it says."""
    metadata = body.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    return (
        str(body.get("kind")),
        str(metadata.get("namespace") or DEFAULT_NAMESPACE),
        str(metadata.get("name")),
    )
