"""The status of a ModelPool, decided without I/O.

Why it exists: the reconcile function gathers observations (the pool, its policy, the
metrics, the Deployment) and hands them here; this module decides what ``status`` says
(conditions with their reasons, phase, plan, capacity, replicas). Keeping it pure makes
every combination a row in a test table. The Events a change implies are decided by
:mod:`.status_events`; TierPolicy and TenantBudget statuses by :mod:`.side_statuses`.

Phase at a glance (first that applies): ``Error`` (no plan: missing TierPolicy, invalid
spec, planner error), ``Degraded`` (replicas disagree on capacity), ``Pending`` (fewer
ready replicas than planned), ``Ready``.

Worked example: a pool whose 2 planned replicas are both ready, measured at 4,096 tokens
with Prometheus up, gets ``phase: Ready``, ``Ready=True/PoolReady``,
``CapacityMeasured=True/Measured``, ``MetricsUnavailable=False/MetricsFresh``,
``CapacityShort=False/CapacitySufficient`` and ``Degraded=False/AsExpected``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.api.common import Condition, ConditionStatus
from kvpool.api.modelpool import LoadStatus, ModelPoolStatus, ReplicaStatus
from kvpool.api.plan import PlanStatus
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
