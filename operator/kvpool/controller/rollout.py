"""The canary rollout of a ModelPool: observe both tracks -> decide (pure) -> apply the
canary children -> hand the rollout status and Events back to the pool reconciler.

Why it exists: a change to what defines the engine (the revision, domain/revision.py) must
not patch the stable Deployment in place. This module observes what the state machine
(:func:`kvpool.domain.rollout.machine.decide_rollout`) needs - the canary's readiness,
schedulability and measured KV, both tracks' TTFT and preemptions over the same
Prometheus window, the stable track's in-flight requests while it drains, the
``kvpool.dev/rollout`` annotation - and applies what the decision implies: the
``<pool>-canary`` Deployment and Service (created, scaled, deleted), the canary track's
own plan (:func:`kvpool.domain.rollout.track_plan.plan_canary`), gauges and Events.

State lives only in ``status.rollout``; the children are a function of it
(:func:`~kvpool.domain.rollout.children.actions_of`) and have fixed names, so an operator
killed at any point and restarted converges: no second canary, stable kept (the stable
Deployment is only *scaled* while a rollout is active, its template pinned), and no step
advanced without a fresh analysis.

Local mode (no pods: the API emulator, a laptop): the ModelPool annotation
``kvpool.dev/canary-static-endpoints`` lists the canary's engines (same syntax as
``kvpool.dev/static-endpoints``) and counts as its ready replicas; nothing else reads it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from kvpool.adapters import kube
from kvpool.adapters.prometheus import (
    MetricsSnapshot,
    PrometheusUnavailable,
    SnapshotCache,
    TrackWindow,
    analysis_window_seconds,
    fetch_track_in_flight_async,
    fetch_track_windows_async,
)
from kvpool.api.admission_config import Endpoint
from kvpool.api.modelpool import ModelPool, ModelPoolStatus
from kvpool.api.rollout import RolloutPhase, RolloutStatus
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller import apply
from kvpool.controller.config import OperatorConfig
from kvpool.controller.metrics import OperatorMetrics
from kvpool.controller.state import OperatorState
from kvpool.domain import manifests as m
from kvpool.domain.compile import CanaryInput, PodView, build_endpoints, parse_static_endpoints
from kvpool.domain.rollout.children import actions_of
from kvpool.domain.rollout.gates import TrackSample
from kvpool.domain.rollout.machine import decide_rollout
from kvpool.domain.rollout.model import (
    RolloutActions,
    RolloutDecision,
    RolloutEvent,
    RolloutObservation,
    WindowAnalysis,
)
from kvpool.domain.rollout.timing import parse_rfc3339, seconds_to_next_analysis
from kvpool.domain.rollout.track_plan import plan_canary
from kvpool.domain.rollout.vocabulary import (
    ANALYZING,
    DRAINING,
    DRAINING_CANARY,
    PROGRESSING,
    REPLACING,
    STARTING,
)

log = logging.getLogger(__name__)

ANALYSIS_SLACK_SECONDS = 0.2  # reconcile this long after an analysis falls due


@dataclass(frozen=True)
class StableTrack:
    """What the pool reconciler knows of the stable track when the rollout is decided."""

    spec_revision: str  # the revision the spec defines now (the canary's, during a rollout)
    kv_tokens: int | None  # measured (or declared) KV tokens per stable replica
    warm_replicas: int  # stable's warm replicas (the plan)


@dataclass(frozen=True)
class RolloutOutcome:
    """What the pool reconciler needs back: the new status, the children, the Events, and
    when to reconcile again without waiting for the next ``--measure-interval`` tick."""

    decision: RolloutDecision
    canary_ready: int
    recheck_after: float | None = None  # seconds (None: the timer's ticks are enough)

    @property
    def status(self) -> RolloutStatus:
        return self.decision.status

    @property
    def actions(self) -> RolloutActions:
        return self.decision.actions


def stable_revision_of(prior: ModelPoolStatus | None, spec_revision: str) -> str:
    """The revision the stable track runs: the rollout's record, else the last status's
    revision (a pool from before rollouts existed), else the spec's (a new pool)."""
    if prior is not None and prior.rollout is not None and prior.rollout.stable_revision:
        return prior.rollout.stable_revision
    if prior is not None and prior.revision:
        return prior.revision
    return spec_revision


def _seed(prior: ModelPoolStatus | None, spec_revision: str) -> RolloutStatus:
    if prior is not None and prior.rollout is not None:
        return prior.rollout
    return RolloutStatus(phase="Idle", stable_revision=stable_revision_of(prior, spec_revision))


def _ready(deployment: Mapping[str, Any] | None) -> int:
    return int(((deployment or {}).get("status") or {}).get("readyReplicas") or 0)


async def _canary_ready(
    client: kube.KubeClient, pool: ModelPool, wanted: int, static: str | None
) -> tuple[int, bool]:
    """Ready canary replicas (local mode: the static endpoints), and - while fewer than
    ``wanted`` are - whether a canary pod is Pending with PodScheduled=False/Unschedulable."""
    if static:
        return len(parse_static_endpoints(static)), False
    namespace = pool.metadata.namespace or "default"
    name = m.child_name(pool.metadata.name, "canary")
    ready = _ready(await client.get(kube.DEPLOYMENTS, namespace, name))
    if ready >= wanted:
        return ready, False
    pods = await client.list_objects(
        kube.PODS, namespace, {m.LABEL_POOL: pool.metadata.name, m.LABEL_TRACK: "canary"}
    )
    unschedulable = any(
        cond.get("type") == "PodScheduled"
        and cond.get("status") == "False"
        and cond.get("reason") == "Unschedulable"
        for pod in pods
        for cond in (pod.get("status") or {}).get("conditions") or []
    )
    return ready, unschedulable


def _min_kv(snapshot: object, namespace: str, pool: str, revision: str | None) -> int | None:
    if revision is None or not isinstance(snapshot, MetricsSnapshot):
        return None
    readings = snapshot.readings_for(namespace, pool, revision)
    return min((r.kv_tokens for r in readings), default=None)


def _sample(value: float | None, samples: float) -> TrackSample:
    return TrackSample(value, round(samples) if math.isfinite(samples) else 0)


def build_window_analysis(stable: TrackWindow | None, canary: TrackWindow | None) -> WindowAnalysis:
    """Both tracks' figures as the gates take them (preemptions per finished request)."""

    def rate(w: TrackWindow | None) -> TrackSample:
        if w is None or w.preemptions is None or w.requests <= 0:
            return _sample(None, w.requests if w else 0.0)
        return _sample(w.preemptions / w.requests, w.requests)

    return WindowAnalysis(
        stable_ttft=_sample(stable.ttft_p95_seconds, stable.ttft_count)
        if stable
        else _sample(None, 0),
        canary_ttft=_sample(canary.ttft_p95_seconds, canary.ttft_count)
        if canary
        else _sample(None, 0),
        stable_preemptions=rate(stable),
        canary_preemptions=rate(canary),
    )


async def _analysis(
    snapshots: SnapshotCache, pool: ModelPool, prior: RolloutStatus, now: datetime.datetime
) -> tuple[WindowAnalysis | None, int | None]:
    """The window analysis when a step is analysing, and stable's in-flight when draining."""
    if prior.phase != PROGRESSING or prior.canary_revision is None:
        return None, None
    if prior.stage not in (ANALYZING, DRAINING):
        return None, None
    # samples since the step began, or since the last counted gate failure: a failure
    # counts once, and the analyses after it judge only what came later
    started = parse_rfc3339(prior.step_started_at) or now
    last_failure = parse_rfc3339(prior.failure_counted_at)
    if last_failure is not None:
        started = max(started, last_failure)
    window = analysis_window_seconds((now - started).total_seconds())
    stable_rev, canary_rev = prior.stable_revision or "", prior.canary_revision
    windows = await fetch_track_windows_async(
        snapshots,
        pool.metadata.namespace or "default",
        pool.metadata.name,
        (stable_rev, canary_rev),
        window,
    )
    if windows is None:
        return WindowAnalysis(error="the operator runs without --prometheus-url"), None
    if isinstance(windows, PrometheusUnavailable):
        return WindowAnalysis(error=windows.message), None
    stable, canary = windows.get(stable_rev), windows.get(canary_rev)
    in_flight = None
    if stable is not None and stable.in_flight is not None:
        in_flight = int(stable.in_flight)
    since = now - datetime.timedelta(seconds=window)
    return dataclasses.replace(build_window_analysis(stable, canary), since=since), in_flight


async def _canary_in_flight(
    snapshots: SnapshotCache, pool: ModelPool, prior: RolloutStatus
) -> int | None:
    """Requests still on the canary track while it drains (None: unknown)."""
    if prior.phase != PROGRESSING or prior.stage != DRAINING_CANARY:
        return None
    value = await fetch_track_in_flight_async(
        snapshots, pool.metadata.namespace or "default", pool.metadata.name, "canary"
    )
    return int(value) if isinstance(value, float) else None


async def _stable_updated(
    client: kube.KubeClient, pool: ModelPool, revision: str, warm: int
) -> bool:
    """Whether the stable Deployment runs ``revision`` and is ready (local mode: labelled)."""
    name = m.child_name(pool.metadata.name, "stable")
    body = await client.get(kube.DEPLOYMENTS, pool.metadata.namespace or "default", name)
    if body is None:
        return False
    labels = (body.get("metadata") or {}).get("labels") or {}
    if labels.get(m.LABEL_REVISION) != revision:
        return False
    if pool.metadata.annotations.get(m.ANNOTATION_STATIC_ENDPOINTS):
        return True
    st = body.get("status") or {}
    return bool(
        int(st.get("updatedReplicas") or 0) >= warm
        and int(st.get("readyReplicas") or 0) >= warm
        and int(st.get("observedGeneration") or 0)
        >= int((body.get("metadata") or {}).get("generation") or 0)
    )


async def _observe(
    state: OperatorState,
    pool: ModelPool,
    before: RolloutStatus,
    stable: StableTrack,
    now: datetime.datetime,
) -> RolloutObservation:
    """What :func:`decide_rollout` needs: both tracks' readiness, KV and window figures."""
    key = (pool.metadata.namespace or "default", pool.metadata.name)
    progressing = before.phase == PROGRESSING
    canary_ready, unschedulable = 0, False
    if before.canary_revision is not None and before.canary_replicas > 0:
        static = state.static.of(pool, m.ANNOTATION_CANARY_STATIC_ENDPOINTS)
        canary_ready, unschedulable = await _canary_ready(
            state.kube, pool, before.canary_replicas, static
        )
    recheck = state.config.rollout_recheck
    waiting = progressing and before.stage == STARTING and recheck > 0
    snapshot = await state.snapshots.get(max_age=recheck / 2 if waiting else None)
    analysis, in_flight = await _analysis(state.snapshots, pool, before, now)
    replacing = progressing and before.stage == REPLACING
    return RolloutObservation(
        revision=stable.spec_revision,
        warm_replicas=stable.warm_replicas,
        canary_ready=canary_ready,
        stable_kv=stable.kv_tokens,
        canary_kv=_min_kv(snapshot, *key, before.canary_revision),
        canary_unschedulable=unschedulable,
        analysis=analysis,
        stable_in_flight=in_flight,
        stable_updated=replacing
        and await _stable_updated(state.kube, pool, stable.spec_revision, stable.warm_replicas),
        action=pool.metadata.annotations.get(m.ANNOTATION_ROLLOUT),
        now=now,
        canary_in_flight=await _canary_in_flight(state.snapshots, pool, before),
    )


async def reconcile_rollout(
    state: OperatorState,
    pool: ModelPool,
    policy: TierPolicy,
    prior: ModelPoolStatus | None,
    stable: StableTrack,
    now: datetime.datetime,
) -> RolloutOutcome:
    """Observe, decide and apply the canary side of a pool's rollout."""
    before = _seed(prior, stable.spec_revision)
    observation = await _observe(state, pool, before, stable, now)
    decision = decide_rollout(pool.spec.rollout, before, observation)
    status = _with_canary_plan(decision.status, pool, policy, decision.actions, observation)
    events = decision.events + _capacity_short_events(before, status)
    decision = RolloutDecision(status, decision.actions, events)
    await apply_canary(state.kube, pool, stable.spec_revision, decision.actions)
    export_rollout(state.metrics, pool.metadata.namespace or "default", pool.metadata.name, status)
    ready = observation.canary_ready if decision.actions.canary_replicas > 0 else 0
    recheck = recheck_after(pool, status, now, state.config)
    return RolloutOutcome(decision=decision, canary_ready=ready, recheck_after=recheck)


def _capacity_short_events(
    before: RolloutStatus, status: RolloutStatus
) -> tuple[RolloutEvent, ...]:
    """A Warning when promoting the canary would newly leave the pool capacity short."""
    if not status.capacity_short_after_promotion or before.capacity_short_after_promotion:
        return ()
    warnings = status.canary_plan.warnings if status.canary_plan else []
    message = f"promoting {status.canary_revision} leaves the pool capacity short: " + "; ".join(
        warnings
    )
    return (RolloutEvent("Warning", "CapacityShortAfterPromotion", message),)


def recheck_after(
    pool: ModelPool, status: RolloutStatus, now: datetime.datetime, config: OperatorConfig
) -> float | None:
    """Seconds until the rollout wants another reconcile, sooner than the next
    ``--measure-interval`` tick: while the KV gate waits for the canary's first measurement
    (every ``rollout_recheck``), and when a step's next analysis falls due (a tick-only
    operator skips a tick that comes just under analysisInterval after the last analysis,
    and waits a whole tick more). None: the ticks are enough (or rechecks are off)."""
    recheck = config.rollout_recheck
    if recheck <= 0:
        return None
    wanted: list[float] = []
    if status.phase == PROGRESSING and status.stage == STARTING:
        wanted.append(recheck)
    due = seconds_to_next_analysis(pool.spec.rollout, status, now)
    if due is not None:
        wanted.append(max(due + ANALYSIS_SLACK_SECONDS, recheck / 4))
    return min(*wanted, config.measure_interval) if wanted else None


def _with_canary_plan(
    status: RolloutStatus,
    pool: ModelPool,
    policy: TierPolicy,
    actions: RolloutActions,
    obs: RolloutObservation,
) -> RolloutStatus:
    """The canary track's own plan, and what promoting it would cost."""
    if actions.canary_revision is None:
        return status.model_copy(
            update={
                "canary_plan": None,
                "replicas_after_promotion": None,
                "capacity_short_after_promotion": None,
            }
        )
    planned = plan_canary(pool, policy, obs.canary_kv, max(actions.canary_replicas, 1))
    full = planned.full
    return status.model_copy(
        update={
            "canary_plan": planned.track,
            "replicas_after_promotion": getattr(full, "replicas", None),
            "capacity_short_after_promotion": getattr(full, "capacity_short", None),
        }
    )


async def apply_canary(
    client: kube.KubeClient, pool: ModelPool, revision: str, actions: RolloutActions
) -> None:
    """The ``<pool>-canary`` Deployment and Service, or their removal."""
    namespace = pool.metadata.namespace or "default"
    name = m.child_name(pool.metadata.name, "canary")
    if actions.canary_revision is None:
        for resource in (kube.DEPLOYMENTS, kube.SERVICES):
            if await client.get(resource, namespace, name) is not None:
                await client.delete(resource, namespace, name)
        return
    await apply.apply_deployment(
        client, m.build_deployment(pool, revision, actions.canary_replicas, "canary")
    )
    await apply.apply_service(client, m.build_service(pool, "canary"))


async def scale_stable(client: kube.KubeClient, pool: ModelPool, replicas: int) -> kube.JsonObject:
    """Scale the pinned stable Deployment (its template is left as it is)."""
    namespace = pool.metadata.namespace or "default"
    name = m.child_name(pool.metadata.name, "stable")
    current = await client.get(kube.DEPLOYMENTS, namespace, name)
    if current is None:
        log.warning(
            "pool %s/%s: the stable Deployment is missing during a rollout", namespace, name
        )
        return {}
    if (current.get("spec") or {}).get("replicas") == replicas:
        return current
    patched = await client.merge_patch(
        kube.DEPLOYMENTS, namespace, name, {"spec": {"replicas": replicas}}
    )
    return patched or current


def build_canary_input(
    pool: ModelPool, status: ModelPoolStatus | None, pods: list[PodView], static: str | None
) -> CanaryInput | None:
    """The canary track of the compiled config, from ``status.rollout`` and its endpoints
    (canary pods, or ``static``: the ``kvpool.dev/canary-static-endpoints`` annotation as
    honoured in local mode, :class:`~kvpool.controller.local_mode.StaticEndpoints`)."""
    rollout = status.rollout if status is not None else None
    if rollout is None or rollout.canary_revision is None:
        return None
    actions = actions_of(pool.spec.rollout, rollout, rollout.canary_replicas)
    if actions.canary_replicas <= 0:
        endpoints: tuple[Endpoint, ...] = ()
    elif static:
        endpoints = parse_static_endpoints(static)
    else:
        endpoints = build_endpoints(pods, pool.spec.engine.port, "canary")
    return CanaryInput(
        revision=rollout.canary_revision,
        weight=actions.weight,
        all_tiers=actions.all_tiers,
        plan=rollout.canary_plan,
        endpoints=endpoints,
    )


def export_rollout(
    metrics: OperatorMetrics, namespace: str, pool: str, status: RolloutStatus
) -> None:
    """The rollout's phase (1 for the current one) and its gates' last figures as gauges."""
    for phase in get_args(RolloutPhase):
        metrics.rollout_phase.labels(namespace, pool, phase).set(1 if status.phase == phase else 0)
    for gate in status.gates:
        for track, value in (("stable", gate.stable), ("canary", gate.canary)):
            if value is not None:
                metrics.rollout_gate_value.labels(namespace, pool, gate.gate, track).set(value)
