"""ModelPool: one model, its vLLM engine settings, its length mix and its rollout policy.

The operator keeps ``status.plan.replicas`` warm engines for a pool, measures each
engine's KV capacity in tokens, and plans how many tokens and slots each tier is
guaranteed (see docs/0001-capacity-planning.md). A GPU holding this model is not spare
capacity for another pool: capacity is per pool and per engine revision.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from kvpool.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    DnsLabel,
    Duration,
    LocalObjectReference,
    ObjectMeta,
    Percent,
    cel,
    validations,
)

DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.11.0"

IntOrString = Annotated[
    int | str,
    Field(description="A quantity: an integer or a string such as '16Gi' or '500m'."),
]


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


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap in the pool's namespace (as in a Pod spec)."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret/ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="The key to read.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class ObjectFieldSelector(ApiModel):
    """A field of the engine pod (downward API), e.g. status.podIP."""

    field_path: str = Field(min_length=1, description="Path of the field, e.g. status.podIP.")
    api_version: str | None = Field(default=None, description="Schema version of the path.")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from (one source; as in a Pod spec)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)]"
                ".filter(x, x).size() == 1",
                "exactly one of secretKeyRef, configMapKeyRef, fieldRef",
            )
        )
    }

    secret_key_ref: KeySelector | None = Field(
        default=None, description="A key of a Secret (e.g. an HF token)."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A ConfigMap key.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A pod field.")


class EnvVar(ApiModel):
    """An environment variable of the engine container: a value or a valueFrom source."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!(has(self.valueFrom) && has(self.value) && self.value != '')",
                "value and valueFrom are exclusive",
            )
        )
    }

    name: str = Field(
        min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Name."
    )
    value: str = Field(default="", description="Value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret, ConfigMap or pod field."
    )


class NamedReference(ApiModel):
    """A Secret or ConfigMap of the pool's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, description="Object name.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class EnvFromSource(ApiModel):
    """Every key of a Secret or ConfigMap as environment variables (as in a Pod spec)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "has(self.secretRef) != has(self.configMapRef)",
                "exactly one of secretRef, configMapRef",
            )
        )
    }

    prefix: str | None = Field(default=None, max_length=256, description="Prefix for each key.")
    secret_ref: NamedReference | None = Field(default=None, description="A Secret.")
    config_map_ref: NamedReference | None = Field(default=None, description="A ConfigMap.")


class LocalName(ApiModel):
    """A reference by name to an object of the pool's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Object name.")


class VolumeMount(ApiModel):
    """A volume mounted into the engine container (as in a Pod spec)."""

    name: str = Field(min_length=1, max_length=63, description="Name of a volume in volumes.")
    mount_path: str = Field(min_length=1, description="Where, e.g. /root/.cache/huggingface.")
    sub_path: str | None = Field(default=None, description="Sub-path of the volume to mount.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")


Capability = Annotated[str, Field(max_length=64)]


class Capabilities(ApiModel):
    """Linux capabilities to add or drop."""

    add: list[Capability] | None = Field(default=None, max_length=64, description="To add.")
    drop: list[Capability] | None = Field(default=None, max_length=64, description="To drop.")


class SeccompProfile(ApiModel):
    """A seccomp profile (as in a Pod spec)."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description="Kind.")
    localhost_profile: str | None = Field(default=None, description="For type Localhost.")


class SecurityContext(ApiModel):
    """The engine container's security context (the commonly used fields of a Pod spec's)."""

    run_as_user: int | None = Field(default=None, ge=0, description="UID to run as.")
    run_as_group: int | None = Field(default=None, ge=0, description="GID to run as.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as root.")
    read_only_root_filesystem: bool | None = Field(default=None, description="Read-only root.")
    allow_privilege_escalation: bool | None = Field(default=None, description="no_new_privs off.")
    privileged: bool | None = Field(default=None, description="Privileged container.")
    capabilities: Capabilities | None = Field(default=None, description="Capabilities.")
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp.")


class PodSecurityContext(ApiModel):
    """The engine pod's security context (the commonly used fields of a Pod spec's)."""

    run_as_user: int | None = Field(default=None, ge=0, description="UID to run as.")
    run_as_group: int | None = Field(default=None, ge=0, description="GID to run as.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as root.")
    fs_group: int | None = Field(default=None, ge=0, description="GID owning the volumes.")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        default=None, description="When to change volume ownership."
    )
    supplemental_groups: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, max_length=32, description="Extra GIDs."
    )
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp.")


class ExecAction(ApiModel):
    """Run a command in the container."""

    command: list[str] = Field(min_length=1, description="Command and arguments.")


class HTTPGetAction(ApiModel):
    """An HTTP GET against the container."""

    path: str | None = Field(default=None, description="Path, e.g. /drain.")
    port: IntOrString = Field(description="Port number or name.")
    scheme: Literal["HTTP", "HTTPS"] | None = Field(default=None, description="HTTP or HTTPS.")


class SleepAction(ApiModel):
    """Sleep before the container gets SIGTERM."""

    seconds: int = Field(ge=0, description="Seconds to sleep.")


class LifecycleHandler(ApiModel):
    """One lifecycle action (exactly one of exec, httpGet, sleep; as in a Pod spec)."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "[has(self.exec), has(self.httpGet), has(self.sleep)].filter(x, x).size() == 1",
                "exactly one of exec, httpGet, sleep",
            )
        )
    }

    exec: ExecAction | None = Field(default=None, description="Run a command.")
    http_get: HTTPGetAction | None = Field(default=None, alias="httpGet", description="HTTP GET.")
    sleep: SleepAction | None = Field(default=None, description="Sleep.")


class Lifecycle(ApiModel):
    """Engine container lifecycle hooks (as in a Pod spec)."""

    pre_stop: LifecycleHandler | None = Field(
        default=None,
        description=(
            "Runs before SIGTERM, e.g. a sleep so the gateway stops routing first and "
            "in-flight requests finish (within terminationGracePeriodSeconds)."
        ),
    )


# Kubernetes objects too large to type here (Volume, Affinity): kept as given, checked by
# the API server when the Deployment is written (and by a test against its schema).
PreservedObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


class ResourceRequirements(ApiModel):
    """Compute resources of the engine container (as in a Pod spec)."""

    requests: dict[str, IntOrString] = Field(
        default_factory=dict, description="Requested resources, e.g. cpu, memory, nvidia.com/gpu."
    )
    limits: dict[str, IntOrString] = Field(
        default_factory=dict, description="Resource limits, e.g. nvidia.com/gpu: 1."
    )


class Toleration(ApiModel):
    """A Pod toleration (as in a Pod spec)."""

    key: str | None = Field(default=None, description="Taint key; empty with Exists matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal."
    )
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="For NoExecute: how long the pod stays bound after the taint."
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
    live_sequences_per_replica: int = Field(description="Sequences one replica holds at p95.")
    total_tokens: int = Field(description="Usable KV tokens across the warm replicas.")
    total_slots: int = Field(description="Sequences across the warm replicas.")
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


class LoadStatus(ApiModel):
    """Live engine signals (pool-wide) at the last observation."""

    kv_usage_percent: float | None = Field(default=None, description="Mean KV cache usage.")
    running: int | None = Field(default=None, description="Sequences running.")
    waiting: int | None = Field(default=None, description="Sequences waiting in engines.")
    preemptions_per_second: float | None = Field(default=None, description="Preemption rate.")
    ttft_p95_seconds: float | None = Field(default=None, description="p95 TTFT, last 5m.")
    observed_at: str | None = Field(default=None, description="When (RFC 3339).")


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

    api_version: Literal["kvpool.dev/v1alpha1"] = Field(
        default=API_VERSION, description="kvpool.dev/v1alpha1"
    )
    kind: Literal["ModelPool"] = Field(default="ModelPool", description="ModelPool")
    metadata: ObjectMeta
    spec: ModelPoolSpec
    status: ModelPoolStatus | None = None


ModelPoolName = DnsLabel
