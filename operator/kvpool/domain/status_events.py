"""The Kubernetes Events a status change implies, decided without I/O.

Why it exists: a human should hear about the decisions that changed - warm replicas
scaled, a pool going capacity short, a measurement that moved, replicas disagreeing,
Prometheus lost, an object entering a blocking reason such as InvalidSpec - once, when
they change, not on every reconcile. Both kinds of status (:mod:`.pool_status`,
:mod:`.side_statuses`) are compared before and after here, and each difference becomes an
:class:`EventIntent` the controller posts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvpool.api.common import Condition
from kvpool.api.modelpool import ModelPoolStatus
from kvpool.domain import conditions as c
from kvpool.domain.measurement import CapacityAssessment

EventType = Literal["Normal", "Warning"]

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
