"""The admission plan in a ModelPool's status: per tier, the tokens and slots guaranteed.

Why it exists: one shape serves the stable track (``status.plan``) and a canary's own plan
(``status.rollout.canaryPlan``), and both are what the gateway enforces once compiled
(docs/0001-capacity-planning.md, docs/0002).
"""

from __future__ import annotations

from pydantic import Field

from kvpool.api.common import ApiModel


class TierPlanStatus(ApiModel):
    """The admission plan of one tier in one pool."""

    name: str = Field(description="Tier name.")
    floor_tokens: int = Field(description="KV tokens guaranteed to the tier across the pool.")
    floor_slots: int = Field(description="Running-batch places guaranteed to the tier.")
    lendable_tokens: int = Field(description="Part of the floor tokens others may borrow.")
    lendable_slots: int = Field(description="Part of the floor slots others may borrow.")
    required_replicas: int | None = Field(
        default=None, description="Replicas this tier's peak needs at its floor."
    )
    capacity_short: bool = Field(
        default=False, description="True when maxReplicas is too low for this tier's peak."
    )


class PlanStatus(ApiModel):
    """The admission plan the gateway enforces."""

    replicas: int = Field(description="Warm replicas.")
    usable_kv_tokens_per_replica: int = Field(description="KV tokens per replica after target.")
    live_sequences_per_replica: int = Field(
        description="Sequences of p95 length one replica's KV holds (sizes the replicas)."
    )
    slots_per_replica: int | None = Field(
        default=None,
        description=(
            "Admission slots per replica: the engine's maxNumSeqs, its running batch (the "
            "slot floors are shares of it). Absent in plans made before it existed: "
            "liveSequencesPerReplica then."
        ),
    )
    total_tokens: int = Field(description="Usable KV tokens across the warm replicas.")
    total_slots: int = Field(description="Admission slots across the warm replicas.")
    shared_tokens: int = Field(description="Tokens reserved to no tier (go by priority).")
    shared_slots: int = Field(description="Slots reserved to no tier (go by priority).")
    tiers: list[TierPlanStatus] = Field(default_factory=list, description="Per tier.")
    warnings: list[str] = Field(default_factory=list, description="Capacity-short and similar.")
    observed_generation: int | None = Field(
        default=None,
        description=(
            "The spec generation this plan was made for. Lower than status.observedGeneration "
            "when the current spec could not be planned (invalid spec, missing or invalid "
            "TierPolicy, planner error) and the last good plan is kept (see ConfigStale)."
        ),
    )
