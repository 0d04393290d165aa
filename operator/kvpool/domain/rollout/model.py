"""What the rollout state machine reads and what it returns, as plain values.

Why it exists: the machine (:mod:`kvpool.domain.rollout.machine`) is one pure function
from (spec, last status, :class:`RolloutObservation`) to a :class:`RolloutDecision`. The
operator (:mod:`kvpool.controller.rollout`) builds the observation from the cluster and
Prometheus and applies the decision; tests build both by hand. Keeping the values apart
from the function lets each side import what it exchanges without the other's workings.

- :class:`WindowAnalysis` - canary and stable figures over one analysis window;
- :class:`RolloutObservation` - what the operator saw this reconcile;
- :class:`RolloutActions` - the child objects a status implies
  (:func:`kvpool.domain.rollout.children.actions_of`);
- :class:`RolloutEvent`, :class:`RolloutDecision` - the Events to post and the whole result.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Literal

from kvpool.api.rollout import RolloutStatus
from kvpool.domain.rollout.gates import TrackSample

NO_SAMPLE = TrackSample(None, 0)  # no figure and no requests: a window not (yet) measured


@dataclass(frozen=True)
class WindowAnalysis:
    """Per-track figures over one window (canary and stable, same window), or an error."""

    stable_ttft: TrackSample = NO_SAMPLE  # p95 TTFT (s), requests with a TTFT
    canary_ttft: TrackSample = NO_SAMPLE
    stable_preemptions: TrackSample = NO_SAMPLE  # preemptions per request
    canary_preemptions: TrackSample = NO_SAMPLE
    error: str | None = None  # Prometheus could not be asked
    since: datetime.datetime | None = None  # the first moment the window covers (None: unknown)


@dataclass(frozen=True)
class RolloutObservation:
    """What the controller saw this reconcile."""

    revision: str  # the revision the spec defines now
    warm_replicas: int  # stable's warm replicas (the plan)
    canary_ready: int  # ready canary replicas
    stable_kv: int | None  # measured KV tokens per replica of the stable revision
    canary_kv: int | None  # measured KV tokens per replica of the canary revision
    canary_unschedulable: bool  # a canary pod is Pending as Unschedulable
    analysis: WindowAnalysis | None  # None: not queried (not due, or not analyzing)
    stable_in_flight: int | None  # running + waiting on the stable revision (None: unknown)
    stable_updated: bool  # the stable Deployment runs `revision` and is ready
    action: str | None  # the kvpool.dev/rollout annotation (None when absent)
    now: datetime.datetime  # this reconcile's time (UTC)
    canary_in_flight: int | None = None  # running + waiting on the canary track (None: unknown)


@dataclass(frozen=True)
class RolloutActions:
    """The child objects the status implies (a function of the status alone)."""

    canary_revision: str | None  # the canary Deployment runs this (None: no canary objects)
    canary_replicas: int  # its replica count
    weight: int  # canary weight in the admission config (percent)
    all_tiers: bool  # every tier may reach the canary (promotion)
    pin_stable: bool  # leave the stable Deployment's template alone (scale only)


@dataclass(frozen=True)
class RolloutEvent:
    """A Kubernetes Event about a rollout transition."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class RolloutDecision:
    """The next status, what it implies for the children, and the Events to post."""

    status: RolloutStatus
    actions: RolloutActions
    events: tuple[RolloutEvent, ...]
