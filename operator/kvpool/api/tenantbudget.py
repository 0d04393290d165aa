"""TenantBudget: one tenant's identity, API keys, allowed tiers and token budgets per window.

A tenant is identified by any of its API keys (``apiKeySecretRef`` and
``apiKeySecretRefs``, at most four): rotating a key is adding the new one, moving the
clients, then removing the old one, with both valid in between.

Budgets keep one tenant from occupying a tier: the gateway charges a request's
reservation at admission and settles the real usage when the response ends. The
TenantBudget's labels are what TierPolicy ``tenantSelector`` rules match.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvpool.api.common import (
    API_VERSION,
    ApiModel,
    ApiVersion,
    Condition,
    DnsLabel,
    LocalObjectReference,
    ObjectMeta,
    SecretKeyReference,
    cel,
    validations,
)

MIN_WINDOW_SECONDS = 60
MAX_WINDOW_SECONDS = 31 * 86400

# The window in seconds, in CEL. Windows use one unit (pattern below) so that CEL
# can bound them: 1m <= window <= 31d.
_WINDOW_SECONDS_CEL = (
    "(self.window.endsWith('d') ? int(self.window.replace('d', '')) * 86400 : "
    "self.window.endsWith('h') ? int(self.window.replace('h', '')) * 3600 : "
    "self.window.endsWith('m') ? int(self.window.replace('m', '')) * 60 : "
    "int(self.window.replace('s', '')))"
)


# The operator watches only Secrets with this label (and digests only those a TenantBudget
# references): it never reads the other Secrets of the cluster.
API_KEY_SECRET_LABEL = "kvpool.dev/api-key"


class BudgetLimit(ApiModel):
    """A token (and optionally request) budget over a sliding window."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                f"{_WINDOW_SECONDS_CEL} >= {MIN_WINDOW_SECONDS} && "
                f"{_WINDOW_SECONDS_CEL} <= {MAX_WINDOW_SECONDS}",
                "window must be between 1m and 31d",
                ".window",
                "'window must be between 1m and 31d (got ' + self.window + ')'",
            )
        )
    }

    # A plain str: on a Duration, the Annotated pattern would win over this one-unit pattern.
    window: str = Field(
        pattern=r"^[1-9][0-9]{0,6}(s|m|h|d)$",
        max_length=32,
        description="Sliding window, one unit: e.g. '1m', '1h', '1d', '30d' (1m to 31d).",
    )
    tokens: int = Field(
        ge=1, description="Prompt plus output tokens the tenant may use per window (> 0)."
    )
    requests: int | None = Field(
        default=None, ge=1, description="Requests the tenant may start per window (> 0)."
    )


MAX_API_KEYS = 4


class TenantBudgetSpec(ApiModel):
    """Desired tenant identity and limits."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "has(self.apiKeySecretRef) || "
                "(has(self.apiKeySecretRefs) && size(self.apiKeySecretRefs) > 0)",
                "a tenant needs an API key: set apiKeySecretRef or apiKeySecretRefs",
            ),
            cel(
                "!has(self.apiKeySecretRef) || !has(self.apiKeySecretRefs) || "
                f"size(self.apiKeySecretRefs) < {MAX_API_KEYS}",
                f"at most {MAX_API_KEYS} API keys per tenant (apiKeySecretRef plus "
                "apiKeySecretRefs)",
                ".apiKeySecretRefs",
            ),
        )
    }

    tenant: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        description="Tenant id, as it appears in metrics and access logs.",
    )
    api_key_secret_ref: SecretKeyReference | None = Field(
        default=None,
        description=(
            "Secret key holding the tenant's API key (only its hash leaves the operator). "
            f'The Secret must carry the label {API_KEY_SECRET_LABEL}: "true"; the operator '
            "reads no other Secrets. Optional when apiKeySecretRefs names the keys."
        ),
    )
    api_key_secret_refs: list[SecretKeyReference] = Field(
        default_factory=list,
        max_length=MAX_API_KEYS,
        description=(
            "More Secret keys holding API keys of this tenant, all valid at once (with "
            "apiKeySecretRef, at most 4): to rotate a key without downtime, add the new "
            "one here, move the clients, then remove the old one. Same Secret rules as "
            "apiKeySecretRef."
        ),
    )
    tier_policy_ref: LocalObjectReference | None = Field(
        default=None,
        description=(
            "TierPolicy whose tiers this tenant uses. Optional when the namespace has "
            "exactly one TierPolicy."
        ),
    )
    tiers: list[DnsLabel] = Field(
        min_length=1,
        max_length=4,
        description="Tiers this tenant may use.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    limits: list[BudgetLimit] = Field(
        default_factory=list,
        max_length=8,
        description="Budgets per window; windows must be unique. Empty means unlimited.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["window"],
        },
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Most requests of this tenant in flight at once in each pool (and, during a "
            "rollout, on each of its tracks). Several gateway replicas lease it by demand "
            "(docs/0008): together they never allow more."
        ),
    )
    weight: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Fair-share weight among the tenants of one tier.",
    )
    over_budget: Literal["Reject", "Demote"] = Field(
        default="Reject",
        description="Over budget: Reject (429 with Retry-After) or Demote to the next lower tier.",
    )


class TenantBudgetStatus(ApiModel):
    """Observed state of a TenantBudget."""

    observed_generation: int | None = Field(
        default=None, description="Last spec generation the operator processed."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, KeyResolved and related conditions."
    )


class TenantBudget(ApiModel):
    """A tenant's budgets (kvpool.dev/v1alpha1 TenantBudget)."""

    api_version: ApiVersion = Field(default=API_VERSION, description=API_VERSION)
    kind: Literal["TenantBudget"] = Field(default="TenantBudget", description="TenantBudget")
    metadata: ObjectMeta
    spec: TenantBudgetSpec
    status: TenantBudgetStatus | None = None

    def key_refs(self) -> list[tuple[str, SecretKeyReference]]:
        """Every API key reference with its field path: ``apiKeySecretRef`` first."""
        refs = [("spec.apiKeySecretRef", self.spec.api_key_secret_ref)]
        refs += [
            (f"spec.apiKeySecretRefs[{index}]", ref)
            for index, ref in enumerate(self.spec.api_key_secret_refs)
        ]
        return [(path, ref) for path, ref in refs if ref is not None]
