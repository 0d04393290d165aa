"""The rollout API of a ModelPool: how a new engine revision is rolled out
(``spec.rollout``) and where the rollout stands (``status.rollout``).

Why it exists: a rollout is its own state machine (:mod:`kvpool.domain.rollout.machine`,
docs/0006-rollouts.md) with its own spec and status; the phase and stage names are
defined once here (:data:`RolloutPhase`, :data:`RolloutStage`) and read by the machine,
the operator's metrics and ``kubectl kvpool rollout``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvpool.api.common import ApiModel, DnsLabel, Duration
from kvpool.api.plan import PlanStatus


class RolloutStep(ApiModel):
    """One canary step: send this weight to the canary, then wait."""

    weight: int = Field(
        ge=1,
        le=100,
        description=(
            "Percent of canary-eligible traffic (tiers in canaryTiers) sent to the canary "
            "during the step (1-100); the canary runs this percent of the stable warm "
            "replicas (at least 1, at most maxSurge)."
        ),
    )
    pause: Duration = Field(
        description=(
            "How long the step lasts before its gates decide: all Successful -> next "
            "step; any Inconclusive -> Paused; a failure beyond failureLimit -> onFailure."
        )
    )


class RolloutGates(ApiModel):
    """What the canary must keep relative to stable (measured over the same window)."""

    min_kv_capacity_ratio: float = Field(
        default=0.9,
        alias="minKVCapacityRatio",
        gt=0,
        le=10,
        description=(
            "Canary KV tokens per replica / stable's must be at least this. Checked as "
            "soon as a canary replica is ready and measured, before the canary gets any "
            "traffic; below it the rollout pauses with reason KVCapacityShrunk."
        ),
    )
    max_ttft_p95_ratio: float = Field(
        default=1.2,
        alias="maxTTFTP95Ratio",
        ge=1,
        le=100,
        description=(
            "Canary p95 time to first token / stable's (vllm:time_to_first_token_seconds, "
            "same window) must be at most this."
        ),
    )
    max_preemption_rate_ratio: float = Field(
        default=1.5,
        ge=1,
        le=100,
        description=(
            "Canary preemptions per request / stable's (same window) must be at most this; "
            "a canary below 0.01 preemptions per request always passes."
        ),
    )
    min_samples: int = Field(
        default=100,
        ge=1,
        description=(
            "Finished requests each track (canary and stable) must have served in the "
            "window before the TTFT and preemption gates give a verdict; fewer is "
            "Inconclusive, never a success."
        ),
    )


class RolloutSpec(ApiModel):
    """How a new engine revision is rolled out (docs/0006-rollouts.md)."""

    steps: list[RolloutStep] = Field(
        default_factory=lambda: [
            RolloutStep(weight=10, pause="5m"),
            RolloutStep(weight=50, pause="10m"),
        ],
        min_length=1,
        max_length=16,
        description="Canary steps in order; promotion follows the last one.",
    )
    gates: RolloutGates = Field(default_factory=RolloutGates, description="Promotion gates.")
    canary_tiers: list[DnsLabel] = Field(
        default_factory=list,
        max_length=4,
        description=(
            "Tiers whose traffic may go to the canary during the steps; empty means the "
            "policy's highest-priority tier only. Other tiers stay on stable until promotion."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    on_failure: Literal["Pause", "Abort"] = Field(
        default="Pause",
        description=(
            "When the TTFT or preemption gate fails more than failureLimit times: Pause "
            "(hold for a human) or Abort (canary weight 0, scaled to zero). A KV capacity "
            "shortfall always pauses."
        ),
    )
    max_surge: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Most canary replicas during the steps (unset: no bound).",
    )
    failure_limit: int = Field(
        default=0,
        ge=0,
        le=100,
        description=(
            "Failed gate analyses tolerated (running total per gate) before onFailure. A "
            "failure counts once: analyses whose window still holds the samples of the last "
            "counted failure do not count again, so a persistent regression acts after about "
            "failureLimit x max(analysisInterval, 30s)."
        ),
    )
    consecutive_error_limit: int = Field(
        default=4,
        ge=0,
        le=100,
        description=(
            "Consecutive analyses without metrics (Prometheus unreachable) tolerated "
            "before the rollout pauses with reason MetricsUnavailable."
        ),
    )
    analysis_interval: Duration = Field(
        default="15s",
        description="Least time between two gate analyses of a step.",
    )
    unschedulable_timeout: Duration = Field(
        default="10m",
        description=(
            "How long a canary pod may stay unschedulable before the rollout pauses with "
            "reason CanaryUnschedulable."
        ),
    )
    drain_timeout: Duration = Field(
        default="2m",
        description=(
            "At promotion, how long to wait for the old stable engines to finish their "
            "requests (running + waiting = 0) before they are replaced, and then for the "
            "canary's before it is deleted."
        ),
    )


RolloutPhase = Literal["Idle", "Progressing", "Paused", "Promoted", "Aborted"]
RolloutStage = Literal[
    "Starting", "Analyzing", "Promoting", "Draining", "ReplacingStable", "DrainingCanary"
]


class GateStatus(ApiModel):
    """The last verdict of one rollout gate, with the figures it compared."""

    gate: Literal["kvCapacity", "ttftP95", "preemptionsPerRequest"] = Field(
        description="kvCapacity, ttftP95 or preemptionsPerRequest."
    )
    verdict: Literal["Successful", "Failed", "Inconclusive"] = Field(
        description="Successful, Failed or Inconclusive."
    )
    reason: str = Field(description="Why (e.g. TTFTRegressed, Inconclusive, MetricsUnavailable).")
    stable: float | None = Field(default=None, description="Stable track's figure.")
    canary: float | None = Field(default=None, description="Canary track's figure.")
    ratio: float | None = Field(default=None, description="canary / stable.")
    threshold: float = Field(description="The gate's ratio threshold.")
    stable_samples: int | None = Field(default=None, description="Requests behind stable's.")
    canary_samples: int | None = Field(default=None, description="Requests behind canary's.")
    failures: int = Field(default=0, description="Failed analyses so far in this rollout.")
    message: str = Field(default="", description="The verdict with its figures.")
    measured_at: str | None = Field(default=None, description="When (RFC 3339).")


class RolloutStatus(ApiModel):
    """State of the rollout of a new engine revision (the operator's only record of it)."""

    phase: RolloutPhase = Field(
        default="Idle", description="Idle, Progressing, Paused, Promoted or Aborted."
    )
    stage: RolloutStage | None = Field(
        default=None,
        description=(
            "While Progressing: Starting (waiting for a measured canary and the KV gate), "
            "Analyzing (steps), Promoting, Draining (old stable finishing requests), "
            "ReplacingStable, DrainingCanary (canary finishing requests)."
        ),
    )
    reason: str | None = Field(default=None, description="Why paused or aborted.")
    message: str | None = Field(default=None, description="The last decision, for humans.")
    stable_revision: str | None = Field(default=None, description="Revision serving by default.")
    canary_revision: str | None = Field(default=None, description="Revision under test.")
    step: int | None = Field(default=None, description="Index of the current step (0-based).")
    steps: int | None = Field(default=None, description="Number of steps.")
    weight: int = Field(default=0, description="Canary weight in the admission config (percent).")
    canary_replicas: int = Field(default=0, description="Replicas the canary is set to.")
    replicas_after_promotion: int | None = Field(
        default=None,
        description="Warm replicas the canary revision needs to keep every tier's floor.",
    )
    capacity_short_after_promotion: bool | None = Field(
        default=None, description="True when maxReplicas cannot cover the canary revision."
    )
    canary_plan: PlanStatus | None = Field(
        default=None,
        description=(
            "The canary track's own admission plan: its measured KV tokens per replica "
            "and per-tier floors over the canary replicas."
        ),
    )
    gates: list[GateStatus] = Field(default_factory=list, description="Last gate verdicts.")
    consecutive_errors: int = Field(default=0, description="Analyses in a row without metrics.")
    handled_action: str | None = Field(
        default=None,
        description="The kvpool.dev/rollout annotation value last handled (or seen at start).",
    )
    started_at: str | None = Field(default=None, description="When the rollout began.")
    step_started_at: str | None = Field(default=None, description="When the step began.")
    last_analysis_at: str | None = Field(default=None, description="Last gate analysis.")
    failure_counted_at: str | None = Field(
        default=None,
        description=(
            "When a gate failure was last counted. Later analyses judge only samples after "
            "it, and a window still holding the samples that failed is not counted again."
        ),
    )
    last_transition_time: str | None = Field(default=None, description="Last phase change.")
    canary_unschedulable_since: str | None = Field(
        default=None, description="Since when a canary pod is unschedulable."
    )
    drain_started_at: str | None = Field(default=None, description="When draining began.")
