"""TierPolicy: the 1-4 priority tiers of a namespace and how requests are classified.

A tier owns a guaranteed floor (a percentage of each pool's KV tokens and admission
slots); capacity above the floors goes to waiting requests by priority. The tier of a
request is derived by the gateway from the endpoint and the tenant (``classification``),
never from anything the caller sends.
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
    Duration,
    LabelSelector,
    ObjectMeta,
    Percent,
    cel,
    validations,
)

MAX_TIERS = 4
# Rules that ``kvpool validate`` explains per index (kvpool.api.validation.semantic).
RULE_UNIQUE_TIER_NAMES = "self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))"
RULE_CLASSIFICATION_TIERS = (
    "!has(self.classification) || self.classification.all(r, "
    "self.tiers.exists(t, t.name == r.tier))"
)
TOO_MANY_TIERS = "at most 4 tiers: more than four tiers becomes a policy nobody can reason about"


class Tier(ApiModel):
    """One priority tier. Tiers are listed highest priority first."""

    name: DnsLabel = Field(description="Tier name (a DNS label), unique within the policy.")
    floor_percent: Percent = Field(
        description=(
            "Guaranteed share (percent) of every pool's KV tokens and admission slots. "
            "The sum over tiers must be <= 100; the rest is shared by priority."
        )
    )
    lend_percent: Percent = Field(
        default=100,
        description="Share (percent) of this tier's idle floor that other tiers may borrow.",
    )
    max_queue_wait: Duration = Field(
        description=(
            "A request that cannot plausibly start within this wait is rejected at once "
            "instead of queueing past its promise."
        )
    )
    ttft_p95_target: Duration | None = Field(
        default=None,
        description=(
            "Target p95 time to first token of the tier's streamed requests, as the gateway "
            "measures it: the gateway throttles the concurrency lent to lower tiers to hold "
            "it (kvpool_gateway_lent_limit), starts no lower-tier request on a replica while "
            "one of this tier's requests there waits for its first token (for at most this "
            "long), and the chart's KvpoolTierTtftAboveTarget alert fires above it."
        ),
    )
    engine_priority: int | None = Field(
        default=None,
        ge=-1000,
        le=1000,
        description=(
            "The vLLM request 'priority' the gateway sets (lower runs first). "
            "Defaults to the tier's position: 0 for the first tier, 1 for the second..."
        ),
    )
    reclaim: Literal["Wait", "Preempt"] = Field(
        default="Wait",
        description=(
            "How the tier takes back capacity it lent: Wait for borrowers to finish, or "
            "Preempt (let the engine preempt borrowers, which burns their recompute)."
        ),
    )
    budget_unavailable: Literal["Allow", "Reject"] | None = Field(
        default=None,
        description=(
            "What the gateway does with this tier's requests while the shared budget store "
            "(Redis) cannot be reached: Allow charges them against a local allowance of "
            "each gateway replica (a share of every tenant limit, 10% by default), Reject "
            "answers 503 budget_unavailable with Retry-After. Unset: the gateway's "
            "--fail-closed-tier list decides (Allow unless the tier is listed)."
        ),
    )


class ClassificationRule(ApiModel):
    """Maps requests to a tier; every given matcher must match. First matching rule wins."""

    path_prefix: str | None = Field(
        default=None,
        pattern=r"^/",
        max_length=256,
        description="Request path prefix, e.g. /v1/chat/completions.",
    )
    host: str | None = Field(
        default=None, max_length=253, description="Exact request Host (without port)."
    )
    tenant_selector: LabelSelector | None = Field(
        default=None, description="Label selector on the tenant's TenantBudget labels."
    )
    tier: DnsLabel = Field(description="Tier assigned to matching requests.")


class TierPolicySpec(ApiModel):
    """Desired tiers and classification rules."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                RULE_UNIQUE_TIER_NAMES,
                "tier names must be unique",
                ".tiers",
                "'tier names must be unique; repeated: ' + self.tiers.filter(t, "
                "!self.tiers.exists_one(u, u.name == t.name)).map(t, t.name).join(', ')",
            ),
            cel(
                "self.tiers.map(t, t.floorPercent).sum() <= 100",
                "the floors of all tiers (floorPercent) must sum to at most 100",
                ".tiers",
                "'the floors of all tiers (floorPercent) must sum to at most 100, not ' + "
                "string(self.tiers.map(t, t.floorPercent).sum()) + ' (' + "
                "self.tiers.map(t, t.name + ' ' + string(t.floorPercent)).join(', ') + ')'",
            ),
            cel(
                RULE_CLASSIFICATION_TIERS,
                "every classification rule must name a tier defined in spec.tiers",
                ".classification",
                "'every classification rule must name a tier defined in spec.tiers (' + "
                "self.tiers.map(t, t.name).join(', ') + '); not defined: ' + "
                "self.classification.filter(r, !self.tiers.exists(t, t.name == r.tier))"
                ".map(r, r.tier).join(', ')",
            ),
        )
    }

    tiers: list[Tier] = Field(
        min_length=1,
        max_length=MAX_TIERS,
        description="1 to 4 tiers, highest priority first.",
        json_schema_extra=validations(cel("size(self) <= 4", TOO_MANY_TIERS)),
    )
    classification: list[ClassificationRule] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Rules mapping requests to tiers; first match wins, unmatched go to the last tier."
        ),
    )


class TierPolicyStatus(ApiModel):
    """Observed state of a TierPolicy."""

    observed_generation: int | None = Field(
        default=None, description="Last spec generation the operator processed."
    )
    pools: int | None = Field(default=None, description="ModelPools that reference this policy.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready and related conditions."
    )


class TierPolicy(ApiModel):
    """A namespace's priority tiers (kvpool.dev/v1alpha1 TierPolicy)."""

    api_version: ApiVersion = Field(default=API_VERSION, description=API_VERSION)
    kind: Literal["TierPolicy"] = Field(default="TierPolicy", description="TierPolicy")
    metadata: ObjectMeta
    spec: TierPolicySpec
    status: TierPolicyStatus | None = None

    def tier_names(self) -> list[str]:
        """Tier names, highest priority first."""
        return [t.name for t in self.spec.tiers]

    def engine_priority(self, tier: str) -> int:
        """The vLLM priority value for a tier (explicit, else its position)."""
        for index, t in enumerate(self.spec.tiers):
            if t.name == tier:
                return t.engine_priority if t.engine_priority is not None else index
        raise KeyError(tier)
