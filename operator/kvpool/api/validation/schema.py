"""OpenAPI schema checks of a custom resource, as the API server would apply them.

The API server defaults a custom resource from its schema, then validates it, pruning
unknown fields silently. ``kvpool validate`` defaults the same way (so CEL rules see
``minReplicas: 1`` when it is omitted) and, instead of pruning, reports unknown fields:
a misspelt ``floorPercnt`` silently dropped is the worst kind of error.

The structural schema is turned into an OpenAPI 3.0 schema for openapi-schema-validator:
``additionalProperties: false`` on every object node with properties, and the
int-or-string extension as ``anyOf [integer, string]``. Each jsonschema error becomes a
:class:`Finding` with a dotted path and a reason a user understands.

Worked example: ``{"spec": {"tiers": [{"name": "a", "floorPercent": 140, ...}]}}``
gives ``Finding("spec.tiers[0].floorPercent", "must be at most 100 (got 140)")``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from jsonschema.exceptions import ValidationError
from openapi_schema_validator import OAS30Validator

from kvpool.api.common import DNS_LABEL_PATTERN, DURATION_PATTERN
from kvpool.api.crd import object_schema
from kvpool.api.validation.results import Finding

Schema = dict[str, Any]

# Patterns whose regular expression means nothing to most readers.
_PATTERN_MEANINGS = {
    DURATION_PATTERN: "not a duration (expected e.g. '500ms', '2s', '10m', '30d')",
    DNS_LABEL_PATTERN: (
        "not a DNS label (lower-case letters, digits and '-', starting and ending with a "
        "letter or digit)"
    ),
    r"^[1-9][0-9]{0,6}(s|m|h|d)$": "not a window in one unit (expected e.g. '1m', '1h', '1d')",
}
_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
}


def format_path(parts: Iterable[str | int]) -> str:
    """A dotted field path: ``["spec", "tiers", 1, "name"]`` -> ``spec.tiers[1].name``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def apply_defaults(schema: Schema, value: Any) -> Any:
    """A copy of ``value`` with schema defaults filled in where a property is absent.

    Like the API server: defaults apply inside objects that are present, never create
    a missing parent object, and apply to list items and map values too.

    >>> apply_defaults({"type": "object", "properties": {"a": {"type": "integer",
    ...     "default": 1}, "b": {"type": "integer"}}}, {"b": 2})
    {'b': 2, 'a': 1}
    """
    if isinstance(value, dict):
        out = {}
        props = schema.get("properties", {})
        for key, item in value.items():
            child = props.get(key, schema.get("additionalProperties"))
            out[key] = apply_defaults(child, item) if isinstance(child, dict) else item
        for key, child in props.items():
            if key not in out and "default" in child:
                out[key] = apply_defaults(child, copy.deepcopy(child["default"]))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def build_validation_schema(schema: Schema) -> Schema:
    """The OpenAPI 3.0 schema that openapi-schema-validator checks objects against."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema:
        out["properties"] = {k: build_validation_schema(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(schema.get("items"), dict):
        out["items"] = build_validation_schema(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = build_validation_schema(schema["additionalProperties"])
    return out


@cache
def _validator(key: str) -> OAS30Validator:
    return OAS30Validator(build_validation_schema(object_schema(key)))


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:37] + "...")
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return str(value)


def _findings(error: ValidationError) -> list[Finding]:
    """One jsonschema error as findings (an unknown-fields error names each field)."""
    path = list(error.absolute_path)
    where = format_path(path)
    rule, bound, value = error.validator, error.validator_value, error.instance
    if rule == "additionalProperties" and isinstance(value, dict):
        known = error.schema.get("properties", {})
        return [
            Finding(format_path([*path, key]), "unknown field") for key in value if key not in known
        ]
    if rule == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return [Finding(format_path([*path, missing]), "required field is missing")]
    reasons = {
        "type": lambda: f"must be {_TYPE_NAMES.get(str(bound), bound)} (got {_describe(value)})",
        "enum": lambda: f"must be one of {', '.join(map(str, bound))} (got {_describe(value)})",
        "pattern": lambda: (
            f"{_describe(value)} is "
            + _PATTERN_MEANINGS.get(str(bound), f"not valid (must match {bound})")
        ),
        "minimum": lambda: (
            f"must be greater than {bound} (got {value})"
            if error.schema.get("exclusiveMinimum") is True
            else f"must be at least {bound} (got {value})"
        ),
        "maximum": lambda: (
            f"must be less than {bound} (got {value})"
            if error.schema.get("exclusiveMaximum") is True
            else f"must be at most {bound} (got {value})"
        ),
        "minItems": lambda: f"must have at least {bound} item(s) (got {len(value)})",
        "maxItems": lambda: f"must have at most {bound} items (got {len(value)})",
        "minLength": lambda: f"must be at least {bound} character(s) long",
        "maxLength": lambda: f"must be at most {bound} characters long (got {len(value)})",
        "anyOf": lambda: f"must be an integer or a string (got {_describe(value)})",
    }
    explain = reasons.get(str(rule))
    return [Finding(where, explain() if explain else error.message)]


def check_schema(kind: str, body: dict[str, Any]) -> list[Finding]:
    """Schema findings for a (defaulted) custom resource of a kvpool kind, in path order."""
    return _check(_validator(kind), body)


def check_value(schema: Schema, value: Any) -> list[Finding]:
    """Schema findings for a value against any structural schema (e.g. a CRD's, as an API
    server would check it), in path order."""
    return _check(OAS30Validator(build_validation_schema(schema)), value)


def _check(validator: OAS30Validator, body: Any) -> list[Finding]:
    errors: Sequence[ValidationError] = sorted(
        validator.iter_errors(body),
        key=lambda e: [(0, p) if isinstance(p, int) else (1, p) for p in e.absolute_path],
    )
    findings: list[Finding] = []
    for error in errors:
        for finding in _findings(error):
            if finding not in findings:
                findings.append(finding)
    return findings
