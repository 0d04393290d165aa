"""The compiled admission config: the contract between the operator and the gateway.

The operator compiles every pool, tier policy and tenant of a namespace into one
document (stored in the ConfigMap ``kvpool-admission`` under key ``config.json``);
the gateway enforces it per request. The gateway also runs from this file alone,
without Kubernetes. The format is versioned (``formatVersion``) and documented in
docs/0002-admission-config.md; a reader rejects a version it does not know.

Everything here is already resolved: durations are seconds, tier order is priority
order, API keys are SHA-256 hex digests (never the key itself).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from kvpool.api.common import LabelSelector

FORMAT_VERSION: Final = 1
CONFIGMAP_NAME = "kvpool-admission"
CONFIGMAP_KEY = "config.json"
# A large config is published in several ConfigMaps (docs/0002, "Sharding"): the index
# ``kvpool-admission`` keeps pools and policies under ``config.json`` and names the tenant
# shards under ``shards.json``; each shard keeps a JSON list of tenants under ``tenants.json``.
SHARDS_KEY = "shards.json"
SHARD_TENANTS_KEY = "tenants.json"
SHARD_NAME_PREFIX = "kvpool-admission-tenants-"


class _Compiled(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class CompiledTier(_Compiled):
    """A tier, resolved: rank 0 is the highest priority."""

    name: str
    rank: int = Field(ge=0, description="Position in the policy; 0 is the highest priority.")
    floor_percent: int
    lend_percent: int
    max_queue_wait_seconds: float
    ttft_p95_target_seconds: float | None = None
    engine_priority: int
    reclaim: Literal["Wait", "Preempt"]
    budget_unavailable: Literal["Allow", "Reject"] | None = Field(
        default=None,
        description="While the shared budget store is down: Allow (local allowance) or "
        "Reject (503); absent = the gateway's --fail-closed-tier default.",
    )


class CompiledRule(_Compiled):
    """A classification rule; all given matchers must match."""

    path_prefix: str | None = None
    host: str | None = None
    tenant_selector: LabelSelector | None = None
    tier: str


class CompiledTierPolicy(_Compiled):
    """A TierPolicy: tiers highest priority first, then the rules."""

    name: str
    tiers: list[CompiledTier]
    classification: list[CompiledRule] = Field(default_factory=list)
    stale: bool | None = Field(
        default=None,
        description=(
            "true when this is the last good version kept because the TierPolicy is now "
            "missing or invalid (fail-static: the gateway keeps enforcing it); else absent."
        ),
    )
    stale_reason: str | None = Field(default=None, description="Why it is kept, for humans.")


class TierAllocation(_Compiled):
    """What one tier is guaranteed in one pool (whole pool, summed over replicas)."""

    floor_tokens: int
    floor_slots: int
    lendable_tokens: int
    lendable_slots: int


class Endpoint(_Compiled):
    """One engine replica the gateway may route to."""

    name: str = Field(description="Replica id (pod name), stable for metrics.")
    url: str = Field(description="Base URL, e.g. http://10.0.0.7:8000.")
    ready: bool = True


class TrackPlan(_Compiled):
    """A track's own admission plan (the canary's: its measured KV over its replicas)."""

    replicas: int
    tokens_per_replica: int
    slots_per_replica: int
    total_tokens: int
    total_slots: int
    shared_tokens: int
    shared_slots: int
    tiers: dict[str, TierAllocation]


class Track(_Compiled):
    """A revision of a pool's engine: stable or canary."""

    name: Literal["stable", "canary"]
    revision: str
    weight: int = Field(
        ge=0, le=100, description="Percent of eligible traffic (stable gets the rest)."
    )
    endpoints: list[Endpoint] = Field(default_factory=list)
    plan: TrackPlan | None = Field(
        default=None,
        description="The track's own plan (canary); absent: the pool's plan (stable).",
    )


class CompiledPool(_Compiled):
    """A ModelPool with its admission plan."""

    name: str
    served_name: str = Field(description="The OpenAI 'model' value clients send.")
    model_version: str
    tier_policy: str
    max_model_len: int
    prompt_tokens_mean: int
    prompt_tokens_p95: int
    output_tokens_mean: int
    output_tokens_p95: int
    tokenizer_path: str | None = None
    replicas: int = Field(description="Warm replicas planned.")
    tokens_per_replica: int = Field(description="Usable KV tokens per replica.")
    slots_per_replica: int = Field(
        description="Admission slots per replica: the engine's maxNumSeqs (its running batch)."
    )
    total_tokens: int
    total_slots: int
    shared_tokens: int
    shared_slots: int
    tiers: dict[str, TierAllocation]
    canary_tiers: list[str] = Field(
        default_factory=list,
        description=(
            "Tiers allowed on the canary; empty means all. The operator lists them "
            "explicitly (spec.rollout.canaryTiers, else the top tier; every tier at promotion)."
        ),
    )
    tracks: list[Track] = Field(default_factory=list)
    plan_ok: bool = Field(
        default=True,
        description="False when no plan could be made (no capacity figure): admit nothing.",
    )
    stale: bool | None = Field(
        default=None,
        description=(
            "true when this is the last good version kept because the ModelPool's current "
            "spec is invalid (fail-static: the gateway keeps serving it); else absent."
        ),
    )
    stale_reason: str | None = Field(default=None, description="Why it is kept, for humans.")


class BudgetWindow(_Compiled):
    """One budget window of a tenant. A hand-written config is held to what the operator
    compiles (TenantBudget: windows 1m to 31d, budgets > 0): a window of 0 s divided by
    zero on every request of the tenant (500), so a reader refuses it (the gateway keeps
    its last good config)."""

    window_seconds: float
    tokens: int
    requests: int | None = None

    @field_validator("window_seconds")
    @classmethod
    def _window_positive(cls, value: float) -> float:
        if not value > 0:
            raise ValueError(
                f"windowSeconds {value:g}: a budget window must be longer than 0 s "
                "(TenantBudget windows are 1m to 31d, e.g. 60)"
            )
        return value

    @field_validator("tokens", "requests")
    @classmethod
    def _budget_positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(
                f"{value}: a budget must be at least 1 (a tenant that may use nothing has "
                "no TenantBudget; TenantBudget requires > 0)"
            )
        return value


Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class CompiledTenant(_Compiled):
    """A tenant, identified by the SHA-256 of its API key (or of any of its keys)."""

    tenant: str
    key_sha256: Sha256Hex
    additional_key_sha256: list[Sha256Hex] | None = Field(
        default=None,
        description=(
            "Digests of the tenant's other valid keys (a key rotation in progress: old and "
            "new authenticate together); absent with a single key."
        ),
    )
    labels: dict[str, str] = Field(default_factory=dict)
    tier_policy: str | None = None
    tiers: list[str]
    limits: list[BudgetWindow] = Field(default_factory=list)
    max_concurrency: int | None = None
    weight: int = 1
    over_budget: Literal["Reject", "Demote"] = "Reject"

    @field_validator("max_concurrency")
    @classmethod
    def _concurrency_positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:  # 0 or -1 let nothing start: admission hung
            raise ValueError(
                f"maxConcurrency {value}: must be at least 1, or absent for no limit "
                "(as TenantBudget spec.maxConcurrency)"
            )
        return value

    @field_validator("weight")
    @classmethod
    def _weight_positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"weight {value}: must be at least 1 (1 is the default)")
        return value

    def key_digests(self) -> tuple[str, ...]:
        """Every digest that authenticates this tenant, ``keySha256`` first."""
        return (self.key_sha256, *(self.additional_key_sha256 or ()))


class AdmissionConfig(_Compiled):
    """The whole compiled document for one namespace."""

    format_version: Literal[1] = FORMAT_VERSION
    namespace: str
    generated_at: str | None = Field(default=None, description="RFC 3339; informational.")
    tier_policies: list[CompiledTierPolicy] = Field(default_factory=list)
    pools: list[CompiledPool] = Field(default_factory=list)
    tenants: list[CompiledTenant] = Field(default_factory=list)

    def to_json(self) -> str:
        """The canonical serialised form (stable key order, for hashing and diffs)."""
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=None)


class TenantShardRef(_Compiled):
    """One tenant shard named by the index: the ConfigMap and the digest of its content."""

    name: str = Field(description="The shard's ConfigMap (kvpool-admission-tenants-<digest>).")
    sha256: Sha256Hex = Field(description="SHA-256 of the shard's tenants.json text.")
    tenants: int = Field(ge=0, description="How many tenants the shard holds.")


class ShardIndex(_Compiled):
    """``shards.json`` of the index ConfigMap: which shards make up this generation.

    Shards are content-addressed (their name carries their digest), so an index always
    names a consistent set: a reader that sees this index and shards of matching digests
    has exactly the config of ``generation``.
    """

    generation: str = Field(description="The config hash of the whole assembled config.")
    tenant_shards: list[TenantShardRef]

    def to_json(self) -> str:
        """The canonical serialised form (as :meth:`AdmissionConfig.to_json`)."""
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=None)
