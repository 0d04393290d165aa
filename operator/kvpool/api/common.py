"""Shared building blocks of the kvpool.dev/v1alpha1 API.

Conventions (see docs/ and the Kubernetes API conventions):
- field names are camelCase on the wire and snake_case in Python;
- token counts are integers, shares are integer percents, durations are strings
  such as ``"2s"``, ``"10m"``, ``"30d"``;
- cross-field rules are CEL ``x-kubernetes-validations`` so that a real API server
  rejects bad objects; :func:`cel` attaches one to a model or field.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "kvpool.dev"
VERSION = "v1alpha1"
# the apiVersion of every kvpool object, as a type for the models' apiVersion field:
# GROUP/VERSION, spelled out because a Literal takes no expression
# (tests/unit/test_crds.py checks that API_VERSION == f"{GROUP}/{VERSION}")
ApiVersion = Literal["kvpool.dev/v1alpha1"]
API_VERSION: Final[ApiVersion] = "kvpool.dev/v1alpha1"
CATEGORY = "kvpool"

DURATION_PATTERN = r"^([0-9]+(ms|s|m|h|d))+$"
_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

Duration = Annotated[
    str,
    Field(
        pattern=DURATION_PATTERN,
        max_length=32,
        description=(
            "A duration: digits and a unit (ms, s, m, h, d), e.g. '500ms', '2s', '10m', '30d'."
        ),
    ),
]
DnsLabel = Annotated[
    str,
    Field(
        pattern=DNS_LABEL_PATTERN,
        min_length=1,
        max_length=63,
        description="A DNS label: lower-case letters, digits and '-', at most 63 characters.",
    ),
]
Percent = Annotated[int, Field(ge=0, le=100)]


def parse_duration(text: str) -> float:
    """Seconds in a duration string.

    >>> parse_duration("1h30m")
    5400.0
    >>> parse_duration("500ms")
    0.5
    """
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"not a duration: {text!r} (expected e.g. '2s', '10m', '30d')")
    return sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))


def cel(
    rule: str, message: str, field_path: str | None = None, message_expression: str | None = None
) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry: a CEL rule and its human message.

    ``message_expression`` (CEL giving a string) is what an API server shows instead of
    ``message`` when it evaluates: use it to name the values at fault."""
    entry = {"rule": rule, "message": message}
    if message_expression is not None:
        entry["messageExpression"] = message_expression
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules, for a model or a field."""
    return {"x-kubernetes-validations": list(rules)}


class ApiModel(BaseModel):
    """Base of every API object part: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it is written to the Kubernetes API (camelCase, no unset optionals)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_merge_patch(self) -> dict[str, Any]:
        """The object as the body of a JSON merge patch that replaces what is stored.

        Unset optionals of objects are sent as ``null`` (a merge patch removes a field only
        when it is null); inside list items they are left out, because a list is replaced
        whole and ``null`` is no valid value of a non-nullable field of its items::

            {"canaryRevision": None, "gates": [{"gate": "ttftP95", "canary": None}]}
            -> {"canaryRevision": None, "gates": [{"gate": "ttftP95"}]}
        """
        body: dict[str, Any] = _without_nulls_in_lists(
            self.model_dump(by_alias=True, mode="json"), False
        )
        return body


def _without_nulls_in_lists(value: Any, in_list: bool) -> Any:
    if isinstance(value, dict):
        return {
            key: _without_nulls_in_lists(item, in_list)
            for key, item in value.items()
            if not (in_list and item is None)
        }
    if isinstance(value, list):
        return [_without_nulls_in_lists(item, True) for item in value]
    return value


class ObjectMeta(BaseModel):
    """The subset of Kubernetes ObjectMeta kvpool reads; other fields are kept, not checked."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True
    )

    name: str = Field(description="Object name, unique in its namespace.")
    namespace: str | None = Field(default=None, description="Namespace of the object.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    uid: str | None = Field(default=None, description="Server-assigned unique id.")
    generation: int | None = Field(default=None, description="Spec generation.")
    resource_version: str | None = Field(default=None, description="Resource version.")


class LocalObjectReference(ApiModel):
    """A reference to another object in the same namespace."""

    name: DnsLabel = Field(description="Name of the referenced object in the same namespace.")


class SecretKeyReference(ApiModel):
    """A key of a Secret in the same namespace."""

    name: str = Field(
        min_length=1, max_length=253, description="Name of the Secret in the same namespace."
    )
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key inside the Secret's data.",
    )


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    model_config = ConfigDict(frozen=True)

    type: str = Field(max_length=316, description="Condition type, e.g. Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason constant for the last transition.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The spec generation this condition was computed from."
    )


class LabelSelectorRequirement(ApiModel):
    """One set-based label requirement."""

    key: str = Field(max_length=317, description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Values for In/NotIn; empty for Exists/DoesNotExist.",
    )


class LabelSelector(ApiModel):
    """A Kubernetes label selector (matchLabels AND matchExpressions)."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels that must all be present with these values."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=16, description="Set-based requirements, all must hold."
    )

    def matches(self, labels: dict[str, str]) -> bool:
        """Whether a label set is selected (Kubernetes semantics; empty selects everything)."""
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present = req.key in labels
            if req.operator == "In" and not (present and labels[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True
