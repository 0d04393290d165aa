"""The schema extensions an API server enforces beyond OpenAPI: CEL rules and list types.

``x-kubernetes-validations`` rules are evaluated with the ``cel`` package (the
common-expression-language bindings) by walking the schema and the object together:
at each node carrying rules, ``self`` is the value at that node. A failing rule is
reported at the node's path plus the rule's ``fieldPath``, with the rule's ``message``.

A failing rule's ``messageExpression`` (a CEL expression giving a string, evaluated on
the same ``self``) is its message, as on an API server; when it cannot be evaluated the
plain ``message`` is used instead.

The cel package implements the CEL core (``has``, ``all``, ``exists``, ``exists_one``,
``map``, ``filter``, ``size``, ``endsWith``, ``int``, ``string``) but not three
Kubernetes library functions our rules and messages use: the list library's ``sum()``
and the strings library's ``replace()`` and ``join()``; :data:`KUBERNETES_FUNCTIONS`
adds them. They give no value (``null``, so the expression fails to type-check inside
CEL) on arguments of the wrong type rather than raising: an exception raised in a
function is printed to stderr by the cel bindings, and a wrongly typed field is the
schema check's to report.

``x-kubernetes-list-type: set`` and ``map`` (unique items / unique keys) are checked here
too, since OpenAPI has no way to say "unique by key".

Worked example: at ``spec`` of a TierPolicy with floors 60 and 50, the rule
``self.tiers.map(t, t.floorPercent).sum() <= 100`` (fieldPath ``.tiers``) is false, giving
``Finding("spec.tiers", "the floors of all tiers (floorPercent) must sum to at most 100")``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import cel

from kvpool.api.validation.results import Finding
from kvpool.api.validation.schema import format_path

Schema = dict[str, Any]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _sum(values: Any) -> Any:
    """Kubernetes CEL list library: ``[1, 2].sum() == 3`` (None unless all are numbers)."""
    if not isinstance(values, list) or not all(_is_number(v) for v in values):
        return None
    return sum(values)


def _replace(text: Any, old: Any, new: Any, limit: Any = -1) -> Any:
    """Kubernetes CEL strings library: ``'1h'.replace('h', '') == '1'`` (None on non-strings)."""
    if not all(isinstance(v, str) for v in (text, old, new)) or not isinstance(limit, int):
        return None
    return text.replace(old, new, limit)


def _join(values: Any, separator: Any = "") -> Any:
    """Kubernetes CEL strings library: ``['a', 'b'].join(', ') == 'a, b'``."""
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    return str(separator).join(values) if isinstance(separator, str) else None


# Marks a finding about a rule that gave no verdict (rather than a violated rule).
UNEVALUATED = "could not be evaluated"

KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sum": _sum,
    "replace": _replace,
    "join": _join,
}


@cache
def compile_rule(rule: str) -> cel.Program:
    """A compiled CEL rule (cached: the same few rules run for every object)."""
    return cel.compile(rule)


def assess_rule(rule: str, value: Any) -> bool | str:
    """Evaluate one rule with ``self`` bound to ``value``.

    Returns True (holds), False (violated) or a string saying why it could not be
    evaluated (a syntax error, a missing field, a type mismatch).

    >>> assess_rule("self.tiers.map(t, t.floorPercent).sum() <= 100",
    ...             {"tiers": [{"floorPercent": 60}, {"floorPercent": 50}]})
    False
    """
    context = cel.Context(variables={"self": value}, functions=KUBERNETES_FUNCTIONS)
    try:
        result = compile_rule(rule).execute(context)
    except Exception as error:  # the cel bindings raise several types; all mean "no verdict"
        return f"{type(error).__name__}: {error}".splitlines()[0]
    if isinstance(result, bool):
        return result
    return f"the rule gave {result!r}, not true or false"


def rule_message(entry: dict[str, Any], value: Any) -> str:
    """The message of a failed rule: its ``messageExpression`` when that gives a string
    (as an API server does), else ``message``, else the rule itself.

    >>> rule_message({"rule": "self.a <= 2", "message": "a is at most 2",
    ...               "messageExpression": "'a is ' + string(self.a) + ', at most 2'"}, {"a": 3})
    'a is 3, at most 2'
    """
    expression = entry.get("messageExpression")
    if expression:
        context = cel.Context(variables={"self": value}, functions=KUBERNETES_FUNCTIONS)
        try:
            text = compile_rule(expression).execute(context)
        except Exception:  # an API server falls back to message too
            text = None
        if isinstance(text, str) and text.strip():
            return text
    return str(entry.get("message") or f"failed rule: {entry['rule']}")


def _list_type_findings(schema: Schema, value: list[Any], path: list[str | int]) -> list[Finding]:
    list_type = schema.get("x-kubernetes-list-type")
    seen: dict[Any, int] = {}
    findings = []
    for index, item in enumerate(value):
        if list_type == "set":
            key: Any = repr(item)
            what = f"duplicate value {item!r}"
        elif list_type == "map" and isinstance(item, dict):
            keys = schema.get("x-kubernetes-list-map-keys", [])
            key = tuple(repr(item.get(k)) for k in keys)
            what = "duplicate entry with " + ", ".join(f"{k} {item.get(k)!r}" for k in keys)
        else:
            continue
        if key in seen:
            where = format_path([*path, seen[key]])
            findings.append(Finding(format_path([*path, index]), f"{what} (also at {where})"))
        else:
            seen[key] = index
    return findings


def check_extensions(
    schema: Schema, value: Any, path: list[str | int] | None = None
) -> list[Finding]:
    """CEL rule and list-type findings for a value and everything below it.

    Children are checked before the node's own rules, so a message about a specific
    field comes before a message about the whole.
    """
    path = path or []
    findings: list[Finding] = []
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, item in value.items():
            child = props.get(key, schema.get("additionalProperties"))
            if isinstance(child, dict):
                findings.extend(check_extensions(child, item, [*path, key]))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            findings.extend(check_extensions(schema["items"], item, [*path, index]))
        findings.extend(_list_type_findings(schema, value, path))
    for entry in schema.get("x-kubernetes-validations", []):
        verdict = assess_rule(entry["rule"], value)
        where = (format_path(path) + entry.get("fieldPath", "")).lstrip(".")
        if verdict is False:
            findings.append(Finding(where, rule_message(entry, value), rule=entry["rule"]))
        elif verdict is not True:
            reason = f"rule {entry['rule']!r} {UNEVALUATED}: {verdict}"
            findings.append(Finding(where, reason, rule=entry["rule"]))
    return findings
