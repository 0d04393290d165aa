"""ModelPool: one model, its vLLM engine settings, its length mix and its rollout policy.

(The core/v1 mirrors of the engine block are in :mod:`kvpool.api.core`, the plan status in
:mod:`kvpool.api.plan`, the rollout spec and status in :mod:`kvpool.api.rollout`.)

The operator keeps ``status.plan.replicas`` warm engines for a pool, measures each
engine's KV capacity in tokens, and plans how many tokens and slots each tier is
guaranteed (see docs/0001-capacity-planning.md). A GPU holding this model is not spare
capacity for another pool: capacity is per pool and per engine revision.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvpool.api.common import (
    API_VERSION,
    ApiModel,
    ApiVersion,
    Condition,
    DnsLabel,
    LocalObjectReference,
    ObjectMeta,
    Percent,
    cel,
    validations,
)
from kvpool.api.core import (
    EnvFromSource,
    EnvVar,
    Lifecycle,
    LocalName,
    PodSecurityContext,
    PreservedObject,
    ResourceRequirements,
    SecurityContext,
    Toleration,
    VolumeMount,
)
from kvpool.api.plan import PlanStatus
from kvpool.api.rollout import RolloutSpec, RolloutStatus

DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.11.0"


class ModelRef(ApiModel):
    """Which model the pool serves."""

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Model to load: a Hugging Face id or a path inside the engine image.",
    )
    served_name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./:]*$",
        description="Name clients use in the 'model' field of OpenAI requests.",
    )
    version: str = Field(
        min_length=1,
        max_length=64,
        description=(
            "Model version; a change is a new engine revision, rolled out as a canary "
            "(spec.rollout)."
        ),
    )
    tokenizer_path: str | None = Field(
        default=None,
        max_length=1024,
        description=(
            "Path (inside the gateway) to the model's tokenizer.json, for exact input "
            "token counts. Without it the gateway estimates from bytes."
        ),
    )


class EngineSpec(ApiModel):
    """The vLLM engine: image, arguments and placement. Any change is a new revision,
    rolled out as a canary (spec.rollout)."""

    image: str = Field(
        default=DEFAULT_ENGINE_IMAGE, min_length=1, description="vLLM OpenAI server image."
    )
    args: list[str] = Field(
        default_factory=list,
        max_length=128,
        description="Extra engine arguments, e.g. --gpu-memory-utilization=0.9.",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64, description="Extra environment variables."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="Container resources."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port the engine serves on.")
    max_num_seqs: int = Field(
        default=256, ge=1, le=65536, description="--max-num-seqs: most sequences in a batch."
    )
    max_model_len: int = Field(
        ge=16, le=10_000_000, description="--max-model-len: most tokens of one sequence."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the engine pods must land on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations of the engine pods."
    )
    # --- pod fields passed through as they are (same names and shapes as a Pod spec) ---
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets/ConfigMaps whose keys become environment variables.",
    )
    volumes: list[PreservedObject] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Pod volumes, as Kubernetes core/v1 Volume objects (e.g. a model-cache PVC, an "
            "emptyDir with medium Memory for /dev/shm). Not typed here: the API server "
            "validates them when the Deployment is written."
        ),
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=32, description="Mounts into the engine container."
    )
    service_account_name: str | None = Field(
        default=None, max_length=253, description="Service account of the engine pods."
    )
    image_pull_secrets: list[LocalName] = Field(
        default_factory=list, max_length=8, description="Secrets for pulling the image."
    )
    affinity: PreservedObject | None = Field(
        default=None,
        description=(
            "Pod affinity/anti-affinity, as a Kubernetes core/v1 Affinity object (e.g. keep "
            "interactive and batch pools on different node pools). Not typed here: the API "
            "server validates it when the Deployment is written."
        ),
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="PriorityClass of the engine pods."
    )
    security_context: SecurityContext | None = Field(
        default=None, description="Security context of the engine container."
    )
    pod_security_context: PodSecurityContext | None = Field(
        default=None, description="Security context of the engine pods (the pod's securityContext)."
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Seconds between SIGTERM and SIGKILL (let in-flight requests finish).",
    )
    lifecycle: Lifecycle | None = Field(default=None, description="Lifecycle hooks (preStop).")


class LengthDistribution(ApiModel):
    """Mean and p95 of a token length."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.p95 >= self.mean",
                "p95 must be greater than or equal to mean",
                ".p95",
                "'p95 (' + string(self.p95) + ') must be greater than or equal to mean (' + "
                "string(self.mean) + ')'",
            )
        )
    }

    mean: int = Field(ge=1, description="Mean tokens.")
    p95: int = Field(ge=1, description="95th percentile tokens (>= mean).")


class Workload(ApiModel):
    """The pool's length mix, measured from traffic."""

    prompt_tokens: LengthDistribution = Field(description="Prompt (input) tokens per request.")
    output_tokens: LengthDistribution = Field(description="Output tokens per request.")


class CapacitySpec(ApiModel):
    """How much warm capacity to keep and how to derive it."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.maxReplicas >= self.minReplicas",
                "maxReplicas must be greater than or equal to minReplicas",
                ".maxReplicas",
                "'maxReplicas (' + string(self.maxReplicas) + ') must be greater than or "
                "equal to minReplicas (' + string(self.minReplicas) + ')'",
            )
        )
    }

    min_replicas: int = Field(default=1, ge=0, le=1000, description="Fewest warm replicas.")
    max_replicas: int = Field(ge=0, le=1000, description="Most warm replicas (>= minReplicas).")
    peak_concurrency: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description=(
            "Measured peak concurrent sequences per tier (tier name -> sequences); the "
            "warm replica count is sized so each tier's floor holds its peak."
        ),
    )
    headroom_percent: int = Field(
        default=20, ge=0, le=1000, description="Extra capacity above the peaks, in percent."
    )
    kv_utilization_target: Percent = Field(
        default=90,
        description="Percent of measured KV tokens the plan may hand out (the rest absorbs error).",
        json_schema_extra=validations(
            cel(
                "self >= 1",
                "kvUtilizationTarget must be at least 1",
                None,
                "'kvUtilizationTarget must be at least 1 (got ' + string(self) + ')'",
            )
        ),
    )
    kv_tokens_per_replica: int | None = Field(
        default=None,
        ge=1,
        description="Declared KV tokens per replica, used only until a measurement exists.",
    )


class ModelPoolSpec(ApiModel):
    """Desired state of a pool of warm vLLM replicas of one model."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.workload.promptTokens.p95 + self.workload.outputTokens.p95 "
                "<= self.engine.maxModelLen",
                "a p95 prompt plus a p95 output must fit in engine.maxModelLen",
                ".workload",
                "'a p95 prompt plus a p95 output must fit in engine.maxModelLen: ' + "
                "string(self.workload.promptTokens.p95) + ' + ' + "
                "string(self.workload.outputTokens.p95) + ' = ' + "
                "string(self.workload.promptTokens.p95 + self.workload.outputTokens.p95) + "
                "' tokens, over maxModelLen ' + string(self.engine.maxModelLen)",
            )
        )
    }

    model: ModelRef = Field(description="The model served.")
    engine: EngineSpec = Field(description="The vLLM engine.")
    tier_policy_ref: LocalObjectReference = Field(
        description="TierPolicy (same namespace) whose tiers share this pool."
    )
    workload: Workload = Field(description="The prompt/output length mix.")
    capacity: CapacitySpec = Field(description="Warm capacity.")
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec, description="Canary rollout of new revisions."
    )


# --- status ---------------------------------------------------------------------------------


class ReplicaStatus(ApiModel):
    """Replica counts."""

    desired: int = Field(default=0, description="Warm replicas the plan asks for.")
    ready: int = Field(default=0, description="Engine replicas passing readiness.")
    canary: int = Field(default=0, description="Replicas of the canary revision.")


class MeasuredCapacity(ApiModel):
    """KV capacity per replica the plan uses, and where it came from."""

    kv_tokens_per_replica: int | None = Field(
        default=None, description="KV tokens one replica holds (minimum over replicas)."
    )
    block_size: int | None = Field(default=None, description="Engine KV block size in tokens.")
    source: Literal["Measured", "Declared", "None"] = Field(
        default="None", description="Measured (from engine metrics), Declared (spec) or None."
    )
    revision: str | None = Field(default=None, description="Engine revision measured.")
    replicas_measured: int | None = Field(default=None, description="Replicas that reported.")
    measured_at: str | None = Field(default=None, description="When (RFC 3339).")


class LoadStatus(ApiModel):
    """Live engine signals (pool-wide) at the last observation."""

    kv_usage_percent: float | None = Field(default=None, description="Mean KV cache usage.")
    running: int | None = Field(default=None, description="Sequences running.")
    waiting: int | None = Field(default=None, description="Sequences waiting in engines.")
    preemptions_per_second: float | None = Field(default=None, description="Preemption rate.")
    ttft_p95_seconds: float | None = Field(default=None, description="p95 TTFT, last 5m.")
    observed_at: str | None = Field(default=None, description="When (RFC 3339).")


class ModelPoolStatus(ApiModel):
    """Observed state of a ModelPool."""

    observed_generation: int | None = Field(
        default=None, description="Last spec generation the operator processed."
    )
    phase: str | None = Field(
        default=None,
        description=(
            "Pending, Ready, Degraded or Error, at a glance (rollouts: status.rollout.phase)."
        ),
    )
    revision: str | None = Field(default=None, description="Current engine revision hash.")
    replicas: ReplicaStatus | None = Field(default=None, description="Replica counts.")
    capacity: MeasuredCapacity | None = Field(default=None, description="KV capacity.")
    plan: PlanStatus | None = Field(default=None, description="The admission plan.")
    load: LoadStatus | None = Field(default=None, description="Live load.")
    rollout: RolloutStatus | None = Field(default=None, description="Rollout state.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")


class ModelPool(ApiModel):
    """A pool of warm vLLM replicas of one model (kvpool.dev/v1alpha1 ModelPool)."""

    api_version: ApiVersion = Field(default=API_VERSION, description=API_VERSION)
    kind: Literal["ModelPool"] = Field(default="ModelPool", description="ModelPool")
    metadata: ObjectMeta
    spec: ModelPoolSpec
    status: ModelPoolStatus | None = None


ModelPoolName = DnsLabel
