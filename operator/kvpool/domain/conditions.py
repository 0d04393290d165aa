"""Condition types and reasons of kvpool objects, and the one rule for updating them.

Why it exists: conditions are how a human (and ``kubectl wait``) learns what the
operator decided. Types and reasons are named constants so that tests, docs and alerts
refer to the same strings, and :func:`set_condition` implements the Kubernetes rule that
``lastTransitionTime`` changes only when the status flips (a new reason or message with
the same status keeps the time: the condition did not transition).

Worked example::

    >>> c = set_condition([], READY, "False", REPLICAS_NOT_READY, "0/1 ready", 1, "t0")
    >>> c = set_condition(c, READY, "False", REPLICAS_NOT_READY, "0/2 ready", 2, "t1")
    >>> c[0].last_transition_time, c[0].message
    ('t0', '0/2 ready')
    >>> set_condition(c, READY, "True", POOL_READY, "", 2, "t2")[0].last_transition_time
    't2'
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.api.common import Condition, ConditionStatus

# --- ModelPool condition types ---------------------------------------------------------------
READY = "Ready"
CAPACITY_MEASURED = "CapacityMeasured"
CAPACITY_SHORT = "CapacityShort"
METRICS_UNAVAILABLE = "MetricsUnavailable"
DEGRADED = "Degraded"
FLOOR_TOO_SMALL = "FloorTooSmall"  # a tier's floorPercent held less than one p95 request
TOKENIZER_DECLARED = "TokenizerDeclared"  # False: the gateway counts prompts by bytes
CONFIG_STALE = "ConfigStale"  # the gateway enforces a plan made for an earlier spec
MODELPOOL_CONDITION_TYPES = (
    READY,
    CAPACITY_MEASURED,
    CAPACITY_SHORT,
    METRICS_UNAVAILABLE,
    DEGRADED,
    FLOOR_TOO_SMALL,
    TOKENIZER_DECLARED,
    CONFIG_STALE,
)
PROGRESSING = "Progressing"  # a canary rollout; set by kvpool.domain.rollout.status

# --- reasons ---------------------------------------------------------------------------------
# Ready
POOL_READY = "PoolReady"  # a plan exists and every warm replica is ready
REPLICAS_NOT_READY = "ReplicasNotReady"  # a plan exists; fewer ready replicas than planned
TIER_POLICY_NOT_FOUND = "TierPolicyNotFound"  # spec.tierPolicyRef names no TierPolicy
INVALID_SPEC = "InvalidSpec"  # schema, CEL, semantic or cross-object checks fail (any kind)
TIER_POLICY_INVALID = "TierPolicyInvalid"  # the referenced TierPolicy fails its checks
# (planner errors - CapacityUnknown, ReplicaTooSmall, ... - are used as Ready reasons too)

# CapacityMeasured
MEASURED = "Measured"  # engines of the current revision report vllm:cache_config_info
DECLARED = "DeclaredCapacity"  # no measurement yet: spec.capacity.kvTokensPerReplica is used
KEPT_LAST_MEASUREMENT = "KeptLastMeasurement"  # metrics gone; the last measurement is kept
NO_CAPACITY = "NoCapacityFigure"  # neither measured nor declared

# CapacityShort
MAX_REPLICAS_TOO_LOW = "MaxReplicasTooLow"  # a tier's peak needs more than maxReplicas
CAPACITY_SUFFICIENT = "CapacitySufficient"

# FloorTooSmall
FLOOR_RAISED = "FloorRaisedToOneRequest"  # the planner raised the floor to one p95 request
FLOORS_HOLD_A_REQUEST = "FloorsHoldARequest"

# TokenizerDeclared
TOKENIZER_PATH_SET = "TokenizerPathSet"  # spec.model.tokenizerPath names one
BYTE_ESTIMATE = "ByteEstimate"  # none: prompts are estimated from their UTF-8 length

# MetricsUnavailable
PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"  # connection error, timeout or HTTP error
NO_ENGINE_METRICS = "NoEngineMetrics"  # Prometheus answers but has no series for the revision
METRICS_DISABLED = "MetricsDisabled"  # the operator runs without --prometheus-url
METRICS_FRESH = "MetricsFresh"

# Degraded
REPLICAS_DISAGREE = "ReplicasDisagree"  # replicas of one revision report different KV sizes
PLAN_FAILED = "PlanFailed"  # no plan could be made (see the Ready message)
AS_EXPECTED = "AsExpected"

# ConfigStale
KEPT_LAST_GOOD = "KeptLastGood"  # the last good plan/config is kept (fail-static)
CONFIG_CURRENT = "ConfigCurrent"  # the published plan is the current spec's
# Progressing (True: Rollout<Stage>, e.g. RolloutAnalyzing; False: the pause reason, or)
NO_ROLLOUT = "NoRollout"
ROLLOUT_ABORTED = "RolloutAborted"
ROLLOUT_PROMOTED = "RolloutPromoted"

# --- TenantBudget / TierPolicy ---------------------------------------------------------------
KEY_RESOLVED = "KeyResolved"  # TenantBudget condition type
SECRET_FOUND = "SecretKeyFound"
SECRET_NOT_FOUND = "SecretKeyNotFound"
SOME_SECRETS_NOT_FOUND = "SomeSecretKeysNotFound"  # several keys, not all of them resolved
DUPLICATE_API_KEY = "DuplicateApiKey"  # another TenantBudget has the same key: neither served
POLICY_READY = "PolicyReady"
POLICY_IN_USE = "InUse"  # a deleted TierPolicy waits for the pools that use it


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of a type, if present."""
    return next((c for c in conditions if c.type == type_), None)


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: str,
) -> list[Condition]:
    """``conditions`` with one condition set; others are kept in their order.

    ``lastTransitionTime`` is kept unless the status flips (or the condition is new).
    """
    previous = find_condition(conditions, type_)
    transition = now if previous is None or previous.status != status else None
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=transition or (previous.last_transition_time if previous else now),
        observed_generation=observed_generation,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]
