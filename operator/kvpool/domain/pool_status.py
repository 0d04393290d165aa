"""The status of kvpool objects and the Events a reconcile produces, decided without I/O.

Why it exists: the reconcile function gathers observations (the pool, its policy, the
metrics, the Deployment) and hands them here; this module decides what ``status`` says
(conditions with their reasons, phase, plan, capacity, replicas) and which decisions a
human should hear about as Kubernetes Events. Keeping it pure makes every combination a
row in a test table.

Phase at a glance (first that applies): ``Error`` (no plan: missing TierPolicy, invalid
spec, planner error), ``Degraded`` (replicas disagree on capacity), ``Pending`` (fewer
ready replicas than planned), ``Ready``.

Worked example: a pool whose 2 planned replicas are both ready, measured at 4,096 tokens
with Prometheus up, gets ``phase: Ready``, ``Ready=True/PoolReady``,
``CapacityMeasured=True/Measured``, ``MetricsUnavailable=False/MetricsFresh``,
``CapacityShort=False/CapacitySufficient`` and ``Degraded=False/AsExpected``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvpool.api.common import Condition, ConditionStatus
from kvpool.api.modelpool import LoadStatus, ModelPoolStatus, ReplicaStatus
from kvpool.api.plan import PlanStatus
from kvpool.api.tenantbudget import API_KEY_SECRET_LABEL, TenantBudgetStatus
from kvpool.api.tierpolicy import TierPolicyStatus
from kvpool.domain import conditions as c
from kvpool.domain.measurement import (
    METRICS_OFF,
    METRICS_OK,
    NO_DATA,
    PROMETHEUS_DOWN,
    CapacityAssessment,
    MetricsState,
)
from kvpool.domain.planner import PlanError, PoolPlan
from kvpool.domain.validity import Verdict

EventType = Literal["Normal", "Warning"]

# Held on a TierPolicy while ModelPools use it: deleting it waits until none does.
FINALIZER_IN_USE = "kvpool.dev/in-use"

# Event reasons (CamelCase constants).
EVENT_SCALED = "ScaledWarmReplicas"
EVENT_CAPACITY_SHORT = "CapacityShort"
EVENT_MEASUREMENT_CHANGED = "MeasurementChanged"
EVENT_REPLICAS_DISAGREE = "ReplicasDisagree"
EVENT_TIER_POLICY_NOT_FOUND = "TierPolicyNotFound"
EVENT_METRICS_UNAVAILABLE = "MetricsUnavailable"
EVENT_INVALID_SPEC = "InvalidSpec"
EVENT_TIER_POLICY_INVALID = "TierPolicyInvalid"
# Ready reasons that stop the operator acting on a pool; entering one (or a new message,
# e.g. another invalid field) is a Warning Event with the same reason.
BLOCKING_REASONS = frozenset(
    {EVENT_TIER_POLICY_NOT_FOUND, EVENT_INVALID_SPEC, EVENT_TIER_POLICY_INVALID}
)


@dataclass(frozen=True)
class EventIntent:
    """A Kubernetes Event to emit on the ModelPool."""

    type: EventType  # Normal or Warning
    reason: str  # CamelCase constant
    message: str  # the decision with its numbers


@dataclass(frozen=True)
class PoolObservation:
    """Everything a status decision needs, gathered by the reconcile."""

    generation: int | None  # metadata.generation of the pool
    revision: str  # current engine revision
    assessment: CapacityAssessment  # capacity figure and its provenance
    plan: PoolPlan | PlanError  # the planner's verdict
    warm_replicas: int  # replicas the Deployment is set to
    ready_replicas: int  # replicas passing readiness
    metrics: MetricsState  # whether Prometheus answered
    metrics_message: str  # details for the MetricsUnavailable condition
    load: LoadStatus | None  # live engine signals, when Prometheus answered
    now: str  # RFC 3339 time of this reconcile
    tokenizer_path: str | None = None  # spec.model.tokenizerPath (None: the byte estimate)


def _tokenizer_condition(obs: PoolObservation) -> tuple[ConditionStatus, str, str]:
    """Whether the gateway can count prompt tokens exactly: only with a declared tokenizer
    (whether it loaded it is the gateway's ``kvpool_gateway_tokenizer_fallback{pool}``)."""
    if obs.tokenizer_path:
        return "True", c.TOKENIZER_PATH_SET, f"the gateway counts prompts with {obs.tokenizer_path}"
    return (
        "False",
        c.BYTE_ESTIMATE,
        "no spec.model.tokenizerPath: the gateway estimates prompt tokens from their UTF-8 "
        "length (3 bytes a token), so reservations and budget charges are approximate",
    )


def _metrics_condition(state: MetricsState) -> tuple[ConditionStatus, str]:
    if state == PROMETHEUS_DOWN:
        return "True", c.PROMETHEUS_UNREACHABLE
    if state == NO_DATA:
        return "True", c.NO_ENGINE_METRICS
    if state == METRICS_OFF:
        return "True", c.METRICS_DISABLED
    return "False", c.METRICS_FRESH


def _capacity_message(a: CapacityAssessment, declared: int | None) -> str:
    if a.reason == c.MEASURED:
        spread = f"; replicas disagree {a.spread[0]}..{a.spread[1]}" if a.spread else ""
        return (
            f"{a.kv_tokens} KV tokens per replica measured on revision {a.revision} "
            f"({a.replicas_measured} replicas){spread}"
        )
    if a.reason == c.KEPT_LAST_MEASUREMENT:
        return f"no fresh readings: keeping the last measurement of {a.kv_tokens} tokens"
    if a.reason == c.DECLARED:
        return f"not measured yet: planning with the declared {declared} tokens per replica"
    return "not measured yet and spec.capacity.kvTokensPerReplica is not set"


def build_pool_status(
    prior: ModelPoolStatus | None, obs: PoolObservation, declared: int | None
) -> ModelPoolStatus:
    """The new ``status`` of a pool whose TierPolicy exists."""
    prior = prior or ModelPoolStatus()
    gen, now, a = obs.generation, obs.now, obs.assessment
    conds: list[Condition] = list(prior.conditions)

    plan = obs.plan if isinstance(obs.plan, PoolPlan) else None
    ready: tuple[ConditionStatus, str, str]
    if isinstance(obs.plan, PlanError):
        ready = ("False", obs.plan.reason, obs.plan.message)
    elif obs.ready_replicas >= obs.warm_replicas:
        ready = ("True", c.POOL_READY, f"{obs.ready_replicas}/{obs.warm_replicas} replicas ready")
    else:
        ready = (
            "False",
            c.REPLICAS_NOT_READY,
            f"{obs.ready_replicas}/{obs.warm_replicas} replicas ready",
        )
    conds = c.set_condition(conds, c.READY, ready[0], ready[1], ready[2], gen, now)

    measured: ConditionStatus = "True" if a.source == "Measured" else "False"
    conds = c.set_condition(
        conds, c.CAPACITY_MEASURED, measured, a.reason, _capacity_message(a, declared), gen, now
    )

    short = plan is not None and plan.capacity_short
    conds = c.set_condition(
        conds,
        c.CAPACITY_SHORT,
        "True" if short else "False",
        c.MAX_REPLICAS_TOO_LOW if short else c.CAPACITY_SUFFICIENT,
        "; ".join(plan.warnings) if plan is not None and short else "",
        gen,
        now,
    )

    small = plan.small_floors if plan is not None else ()
    conds = c.set_condition(
        conds,
        c.FLOOR_TOO_SMALL,
        "True" if small else "False",
        c.FLOOR_RAISED if small else c.FLOORS_HOLD_A_REQUEST,
        "; ".join(w for w in plan.warnings if any(repr(t) in w for t in small))
        if plan is not None and small
        else "",
        gen,
        now,
    )

    conds = c.set_condition(conds, c.TOKENIZER_DECLARED, *_tokenizer_condition(obs), gen, now)

    m_status, m_reason = _metrics_condition(obs.metrics)
    conds = c.set_condition(
        conds, c.METRICS_UNAVAILABLE, m_status, m_reason, obs.metrics_message, gen, now
    )

    degraded: tuple[ConditionStatus, str, str]
    if a.disagree and a.spread is not None:
        degraded = (
            "True",
            c.REPLICAS_DISAGREE,
            f"replicas of revision {a.revision} report {a.spread[0]}..{a.spread[1]} KV tokens; "
            f"planning with the minimum",
        )
    elif isinstance(obs.plan, PlanError):
        degraded = ("True", c.PLAN_FAILED, obs.plan.message)
    else:
        degraded = ("False", c.AS_EXPECTED, "")
    conds = c.set_condition(conds, c.DEGRADED, degraded[0], degraded[1], degraded[2], gen, now)
    kept = prior.plan if plan is None else None
    conds = _config_stale(conds, kept, gen, now)

    if plan is None:
        phase = "Error"
    elif a.disagree:
        phase = "Degraded"
    elif obs.ready_replicas < obs.warm_replicas:
        phase = "Pending"
    else:
        phase = "Ready"

    return ModelPoolStatus(
        observed_generation=gen,
        phase=phase,
        revision=obs.revision,
        replicas=ReplicaStatus(desired=obs.warm_replicas, ready=obs.ready_replicas),
        capacity=a.to_status(),
        # fail-static: a failed plan keeps the last one the gateway is enforcing; the
        # plan says which generation it was made for, ConfigStale says it is kept
        plan=(
            plan.to_status().model_copy(update={"observed_generation": gen})
            if plan is not None
            else prior.plan
        ),
        load=obs.load if obs.metrics == METRICS_OK else prior.load,
        rollout=prior.rollout,
        conditions=conds,
    )


def _config_stale(
    conds: list[Condition], kept: PlanStatus | None, generation: int | None, now: str
) -> list[Condition]:
    """``ConfigStale``: True when a plan made for an earlier spec is kept (fail-static)."""
    if kept is None:
        return c.set_condition(
            conds, c.CONFIG_STALE, "False", c.CONFIG_CURRENT, "", generation, now
        )
    made_for = (
        f"generation {kept.observed_generation}"
        if kept.observed_generation is not None
        else "an earlier generation"
    )
    message = (
        f"the gateway keeps enforcing the last good plan (made for {made_for}); "
        "see the Ready condition for why the current spec is not planned"
    )
    return c.set_condition(
        conds, c.CONFIG_STALE, "True", c.KEPT_LAST_GOOD, message, generation, now
    )


def build_blocked_status(
    prior: ModelPoolStatus | None, generation: int | None, reason: str, message: str, now: str
) -> ModelPoolStatus:
    """The status of a pool the operator must not act on (invalid spec, TierPolicy missing
    or invalid): ``Ready=False`` and ``Degraded=True`` with ``reason``, phase ``Error``,
    the last plan kept with ``ConfigStale=True``; no other field changes.

    >>> s = build_blocked_status(None, 3, "InvalidSpec", "spec.x: bad", "t0")
    >>> (s.phase, s.observed_generation, [(x.type, x.reason) for x in s.conditions][:2])
    ('Error', 3, [('Ready', 'InvalidSpec'), ('Degraded', 'InvalidSpec')])
    """
    prior = prior or ModelPoolStatus()
    conds = c.set_condition(prior.conditions, c.READY, "False", reason, message, generation, now)
    conds = c.set_condition(conds, c.DEGRADED, "True", reason, message, generation, now)
    conds = _config_stale(conds, prior.plan, generation, now)
    return prior.model_copy(
        update={"observed_generation": generation, "phase": "Error", "conditions": conds}
    )


def build_missing_policy_status(
    prior: ModelPoolStatus | None, generation: int | None, policy: str, now: str
) -> ModelPoolStatus:
    """The status of a pool whose TierPolicy does not exist: everything else is kept."""
    message = f"TierPolicy {policy!r} not found in the namespace; the engines are left as they are"
    return build_blocked_status(prior, generation, c.TIER_POLICY_NOT_FOUND, message, now)


def build_invalid_status(
    prior: ModelPoolStatus | None, generation: int | None, message: str, now: str
) -> ModelPoolStatus:
    """The status of a pool whose spec cannot be used: ``Ready=False/InvalidSpec`` (the
    message lists every field path and reason), phase ``Error``; the last plan is kept.

    >>> s = build_invalid_status(None, 3, "spec.x: bad", "t0")
    >>> (s.phase, s.observed_generation, s.conditions[0].reason)
    ('Error', 3, 'InvalidSpec')
    """
    return build_blocked_status(prior, generation, c.INVALID_SPEC, message, now)


def keep_load_time(load: LoadStatus | None, prior: ModelPoolStatus | None) -> LoadStatus | None:
    """Keep ``observedAt`` while the values are unchanged (no status write per tick)."""
    if load is None or prior is None or prior.load is None:
        return load
    if load.model_copy(update={"observed_at": None}) == prior.load.model_copy(
        update={"observed_at": None}
    ):
        return prior.load
    return load


def plan_events(
    prior: ModelPoolStatus | None, new: ModelPoolStatus, assessment: CapacityAssessment | None
) -> list[EventIntent]:
    """Events for the decisions in ``new`` that differ from ``prior``.

    >>> from kvpool.api.modelpool import ReplicaStatus
    >>> old = ModelPoolStatus(replicas=ReplicaStatus(desired=1))
    >>> new = ModelPoolStatus(replicas=ReplicaStatus(desired=3))
    >>> [e.reason for e in plan_events(old, new, None)]
    ['ScaledWarmReplicas']
    """
    prior = prior or ModelPoolStatus()
    events: list[EventIntent] = []
    before = prior.replicas.desired if prior.replicas is not None else None
    after = new.replicas.desired if new.replicas is not None else None
    if after is not None and before != after:
        events.append(
            EventIntent("Normal", EVENT_SCALED, f"warm replicas {before or 0} -> {after}")
        )
    was_short = _is_true(prior.conditions, c.CAPACITY_SHORT)
    short = c.find_condition(new.conditions, c.CAPACITY_SHORT)
    if short is not None and short.status == "True" and not was_short:
        events.append(EventIntent("Warning", EVENT_CAPACITY_SHORT, short.message))
    if assessment is not None and assessment.changed_significantly:
        events.append(
            EventIntent(
                "Normal",
                EVENT_MEASUREMENT_CHANGED,
                f"KV tokens per replica {assessment.previous_kv_tokens} -> "
                f"{assessment.kv_tokens} ({assessment.change_ratio:+.0%}) on revision "
                f"{assessment.revision}",
            )
        )
    cond = c.find_condition(new.conditions, c.DEGRADED)
    old = c.find_condition(prior.conditions, c.DEGRADED)
    if (
        cond is not None
        and cond.reason == EVENT_REPLICAS_DISAGREE
        and (old is None or old.reason != EVENT_REPLICAS_DISAGREE)
    ):
        events.append(EventIntent("Warning", EVENT_REPLICAS_DISAGREE, cond.message))
    events += status_events(prior.conditions, new.conditions)
    metrics = c.find_condition(new.conditions, c.METRICS_UNAVAILABLE)
    if (
        metrics is not None
        and metrics.status == "True"
        and not _is_true(prior.conditions, c.METRICS_UNAVAILABLE)
    ):
        events.append(EventIntent("Warning", EVENT_METRICS_UNAVAILABLE, metrics.message))
    return events


def _is_true(conditions: list[Condition], type_: str) -> bool:
    cond = c.find_condition(conditions, type_)
    return cond is not None and cond.status == "True"


def build_policy_status(
    prior: TierPolicyStatus | None,
    generation: int | None,
    pools: int,
    now: str,
    verdict: Verdict | None = None,
    waiting_for: Sequence[str] = (),
) -> TierPolicyStatus:
    """A TierPolicy's status: whether it is valid, how many pools use it, and - when it
    is being deleted while in use - which pools its deletion waits for.

    >>> build_policy_status(None, 1, 2, "t0").conditions[0].message
    'used by 2 ModelPools'
    >>> from kvpool.api.validation import Finding
    >>> bad = Verdict("InvalidSpec", (Finding("spec.tiers", "floors sum over 100"),))
    >>> build_policy_status(None, 1, 0, "t0", bad).conditions[0].reason
    'InvalidSpec'
    """
    ready: tuple[ConditionStatus, str, str]
    if verdict is not None and not verdict.valid:
        ready = (
            "False",
            verdict.reason,
            f"{verdict.message} (not published; the gateway keeps the last valid version "
            "of this policy, if one was published)",
        )
    elif waiting_for:
        ready = (
            "True",
            c.POLICY_IN_USE,
            f"deletion waits until no ModelPool uses it (finalizer {FINALIZER_IN_USE}): "
            + ", ".join(sorted(waiting_for)),
        )
    else:
        ready = ("True", c.POLICY_READY, f"used by {pools} ModelPools")
    conds = c.set_condition(
        (prior.conditions if prior else []), c.READY, ready[0], ready[1], ready[2], generation, now
    )
    return TierPolicyStatus(observed_generation=generation, pools=pools, conditions=conds)


@dataclass(frozen=True)
class KeyLookup:
    """One API key reference of a TenantBudget and whether the operator holds its digest."""

    secret: str  # Secret name
    key: str  # key in the Secret
    resolved: bool  # the labelled Secret exists and has the key

    def describe(self) -> str:
        return f"key {self.key!r} of Secret {self.secret!r}"


def _key_condition(keys: Sequence[KeyLookup]) -> tuple[ConditionStatus, str, str]:
    """KeyResolved: True while one key at least authenticates the tenant."""
    found = [k for k in keys if k.resolved]
    missing = [k for k in keys if not k.resolved]
    listed = ", ".join(k.describe() for k in missing)
    if not keys:
        return "False", c.SECRET_NOT_FOUND, "no API key referenced (its requests get 401)"
    if not found:
        return (
            "False",
            c.SECRET_NOT_FOUND,
            f"{listed} not found (Secrets labelled {API_KEY_SECRET_LABEL}): the tenant is "
            "left out of the admission config (its requests get 401)",
        )
    if missing:
        return (
            "True",
            c.SOME_SECRETS_NOT_FOUND,
            f"{len(found)} of {len(keys)} keys resolved; {listed} not found (Secrets "
            f"labelled {API_KEY_SECRET_LABEL}): requests with that key get 401",
        )
    if len(keys) == 1:
        return "True", c.SECRET_FOUND, f"{keys[0].describe()} resolved"
    return (
        "True",
        c.SECRET_FOUND,
        f"{len(keys)} keys resolved, each authenticates the tenant: "
        + ", ".join(k.describe() for k in keys),
    )


def build_budget_status(
    prior: TenantBudgetStatus | None,
    generation: int | None,
    keys: Sequence[KeyLookup],
    now: str,
    verdict: Verdict | None = None,
) -> TenantBudgetStatus:
    """A TenantBudget's status: whether its API keys could be read (without one the tenant
    is not served) and whether the budget is valid (an invalid one is not published).

    >>> s = build_budget_status(None, 1, [KeyLookup("acme-key", "api-key", False)], "t0")
    >>> [(x.type, x.status, x.reason) for x in s.conditions]
    [('KeyResolved', 'False', 'SecretKeyNotFound'), ('Ready', 'False', 'SecretKeyNotFound')]
    """
    status, reason, message = _key_condition(keys)
    resolved = status == "True"
    conds = c.set_condition(
        (prior.conditions if prior else []),
        c.KEY_RESOLVED,
        status,
        reason,
        message,
        generation,
        now,
    )
    if verdict is not None and verdict.reason == c.INVALID_SPEC:
        status, reason = "False", c.INVALID_SPEC
        message = f"{verdict.message} (not published: the tenant's requests get 401)"
    elif verdict is not None and not verdict.valid and resolved:
        status, reason = "False", verdict.reason
        message = (
            f"{verdict.message} (published against the last valid version of the policy, "
            "if one was published)"
        )
    conds = c.set_condition(conds, c.READY, status, reason, message, generation, now)
    return TenantBudgetStatus(observed_generation=generation, conditions=conds)


def status_events(prior: Sequence[Condition], new: Sequence[Condition]) -> list[EventIntent]:
    """A Warning Event when an object's ``Ready`` enters a blocking reason (InvalidSpec,
    TierPolicyNotFound, TierPolicyInvalid) or its message changes while there.

    >>> bad = c.set_condition([], c.READY, "False", "InvalidSpec", "spec.a: bad", 1, "t0")
    >>> [e.reason for e in status_events([], bad)], status_events(bad, bad)
    (['InvalidSpec'], [])
    """
    ready = c.find_condition(new, c.READY)
    was = c.find_condition(prior, c.READY)
    if ready is None or ready.reason not in BLOCKING_REASONS:
        return []
    if was is not None and (was.reason, was.message) == (ready.reason, ready.message):
        return []
    return [EventIntent("Warning", ready.reason, ready.message)]
