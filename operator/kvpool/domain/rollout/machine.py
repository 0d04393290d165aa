"""The rollout state machine: one pure step from (spec, last status, observations) to the
next ``status.rollout``, the child objects it implies and the Events to post.

Why it exists: a rollout spans many reconciles and operator restarts. Everything it knows
lives in ``status.rollout`` (the only state), and every decision is this one function, so
an operator killed at any point recomputes the same decision from status and fresh
observations: it never creates a second canary (names are fixed), never loses stable (the
stable Deployment is only scaled while a rollout is active) and never advances a step
without a fresh, successful analysis.

Phases and stages::

    Idle --spec revision changes--> Progressing/Starting  (canary created, weight 0)
      Starting   canary ready + measured -> KV gate: Successful -> Analyzing, step 0 weight
                                                     Failed     -> Paused KVCapacityShrunk
      Analyzing  every analysisInterval: TTFT + preemption gates over the samples since the
                 step began or the last counted failure (a failure counts once: a window
                 still holding its samples fails again without counting);
                 step pause elapsed: all Successful -> next step / Promoting,
                 Inconclusive -> Paused Inconclusive, failures > failureLimit -> onFailure,
                 query errors > consecutiveErrorLimit -> Paused MetricsUnavailable
      Promoting  canary at the full warm count, weight 100, every tier
      Draining   old stable gets nothing; wait until it runs nothing (or drainTimeout)
      ReplacingStable  the stable Deployment gets the new revision; when it is ready ->
      DrainingCanary   stable takes all traffic; the canary finishes its requests (or
                       drainTimeout) ->
    Promoted (canary removed; the new revision is stable)

    Paused  (KVCapacityShrunk, TTFTRegressed, PreemptionsRegressed, Inconclusive,
             MetricsUnavailable, CanaryUnschedulable, ManualPause): canary weight 0 (held
             only for ManualPause); `resume` continues the step, `promote`/`abort` act.
    Aborted canary weight 0, scaled to zero, stable pinned; `resume` starts again at step 0.

Any phase: the spec reverted to the stable revision -> Idle (canary removed); a new
revision -> the canary is superseded (same Deployment, new template, back to step 0).

User actions come from the annotation ``kvpool.dev/rollout`` (``resume``, ``abort``,
``promote``, ``pause``, optionally suffixed ``@token`` so a repeated action is a new
value). A value is acted on once: ``status.rollout.handledAction`` records it, and a
rollout starting records the annotation it finds, so a stale value never fires.

Worked example (steps 10% then 50%, stable 4 warm replicas, minKVCapacityRatio 0.9):
revision b replaces a -> Progressing/Starting, canary 1 replica, weight 0; the canary
reports 1,024 KV tokens against stable's 2,048 -> ratio 0.50 < 0.9 -> Paused
KVCapacityShrunk, weight stays 0; ``kvpool.dev/rollout=abort`` -> Aborted, canary scaled
to 0; reverting the spec to a -> Idle.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from kvpool.api.common import parse_duration
from kvpool.api.rollout import GateStatus, RolloutPhase, RolloutSpec, RolloutStage, RolloutStatus
from kvpool.domain.rollout.gates import (
    INCONCLUSIVE,
    KV_CAPACITY_SHRUNK,
    METRICS_UNAVAILABLE,
    Failed,
    GateVerdict,
    Inconclusive,
    Successful,
    TrackSample,
    assess_kv_capacity,
    assess_preemptions,
    assess_ttft,
)

# the names of RolloutPhase and RolloutStage (kvpool.api.rollout), typed by them
IDLE: Final[RolloutPhase] = "Idle"
PROGRESSING: Final[RolloutPhase] = "Progressing"
PAUSED: Final[RolloutPhase] = "Paused"
PROMOTED: Final[RolloutPhase] = "Promoted"
ABORTED: Final[RolloutPhase] = "Aborted"
STARTING: Final[RolloutStage] = "Starting"
ANALYZING: Final[RolloutStage] = "Analyzing"
PROMOTING: Final[RolloutStage] = "Promoting"
DRAINING: Final[RolloutStage] = "Draining"
REPLACING: Final[RolloutStage] = "ReplacingStable"
DRAINING_CANARY: Final[RolloutStage] = "DrainingCanary"
CANARY_UNSCHEDULABLE = "CanaryUnschedulable"
MANUAL_PAUSE = "ManualPause"
MANUAL_ABORT = "ManualAbort"
MANUAL_PROMOTE = "ManualPromote"

ACTIONS = ("resume", "abort", "promote", "pause")

# Event reasons
EVENT_STARTED = "RolloutStarted"
EVENT_STEP = "RolloutStep"
EVENT_PAUSED = "RolloutPaused"
EVENT_RESUMED = "RolloutResumed"
EVENT_ABORTED = "RolloutAborted"
EVENT_PROMOTING = "RolloutPromoting"
EVENT_PROMOTED = "RolloutPromoted"
EVENT_REVERTED = "RolloutReverted"
EVENT_SUPERSEDED = "RolloutSuperseded"
EVENT_ACTION_IGNORED = "RolloutActionIgnored"
EVENT_GATE_FAILED = "RolloutGateFailed"


NO_SAMPLE = TrackSample(None, 0)


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


def to_rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def _elapsed(since: str | None, now: datetime.datetime) -> float | None:
    start = parse_rfc3339(since)
    return None if start is None else (now - start).total_seconds()


def seconds_to_next_analysis(
    spec: RolloutSpec, status: RolloutStatus, now: datetime.datetime
) -> float | None:
    """While a step is analysing: seconds until the next analysis is due (``analysisInterval``
    after the last one, or after the step began); None in any other stage. The operator
    reconciles then, so analyses follow ``analysisInterval`` instead of its slower ticks.

    >>> at = datetime.datetime(2026, 1, 1, 0, 0, 10, tzinfo=datetime.UTC)
    >>> st = RolloutStatus(phase=PROGRESSING, stage=ANALYZING,
    ...                    last_analysis_at="2026-01-01T00:00:00Z")
    >>> seconds_to_next_analysis(RolloutSpec(analysis_interval="15s"), st, at)
    5.0
    """
    if status.phase != PROGRESSING or status.stage != ANALYZING:
        return None
    since = _elapsed(status.last_analysis_at or status.step_started_at, now)
    if since is None:
        return 0.0
    return max(0.0, parse_duration(spec.analysis_interval) - since)


def canary_replicas_for(spec: RolloutSpec, warm: int, weight: int) -> int:
    """A step's weight of the stable warm replicas, at least 1, at most maxSurge.

    >>> canary_replicas_for(RolloutSpec(), 4, 10), canary_replicas_for(RolloutSpec(), 4, 50)
    (1, 2)
    >>> canary_replicas_for(RolloutSpec(max_surge=1), 10, 50)
    1
    """
    replicas = max(1, math.ceil(warm * weight / 100))
    return min(replicas, spec.max_surge) if spec.max_surge is not None else replicas


def parse_action(value: str | None) -> str | None:
    """The action of an annotation value (``resume`` or ``resume@anything``), else None.

    >>> parse_action("promote@1733047200"), parse_action("bogus"), parse_action(None)
    ('promote', None, None)
    """
    if not value:
        return None
    action = value.split("@", 1)[0].strip().lower()
    return action if action in ACTIONS else None


def actions_of(spec: RolloutSpec, status: RolloutStatus, warm: int) -> RolloutActions:
    """What the children must look like for ``status`` (restart-safe: status alone)."""
    if status.phase in (IDLE, PROMOTED) or status.canary_revision is None:
        return RolloutActions(None, 0, 0, False, pin_stable=False)
    if status.phase == ABORTED:
        return RolloutActions(status.canary_revision, 0, 0, False, pin_stable=True)
    if status.phase == PROGRESSING and status.stage == DRAINING_CANARY:
        # the new stable serves everything; the canary finishes what it runs, then goes
        return RolloutActions(status.canary_revision, max(warm, 1), 0, False, pin_stable=False)
    promoting = status.phase == PROGRESSING and status.stage in (PROMOTING, DRAINING, REPLACING)
    if promoting:
        return RolloutActions(
            status.canary_revision,
            max(warm, 1),
            100,
            True,
            pin_stable=status.stage != REPLACING,
        )
    return RolloutActions(
        status.canary_revision,
        max(status.canary_replicas, 1),
        status.weight,
        False,
        pin_stable=True,
    )


def _gate_status(
    verdict: GateVerdict, prior: list[GateStatus], now: str, count_failure: bool
) -> GateStatus:
    m = verdict.measured
    old = next((g for g in prior if g.gate == m.gate), None)
    failed = isinstance(verdict, Failed)
    failures = (old.failures if old else 0) + (1 if count_failure and failed else 0)
    message = verdict.message
    if failed and not count_failure:
        message += " (the window still holds the samples of the last counted failure: not counted)"

    def finite(x: float | None) -> float | None:
        return round(x, 6) if x is not None and math.isfinite(x) else None

    return GateStatus(
        gate=m.gate,
        verdict=verdict.verdict,
        reason=verdict.reason,
        stable=finite(m.stable),
        canary=finite(m.canary),
        ratio=finite(m.ratio),
        threshold=m.threshold,
        stable_samples=m.stable_samples,
        canary_samples=m.canary_samples,
        failures=failures,
        message=message,
        measured_at=now,
    )


def _set_gates(status: RolloutStatus, gates: list[GateStatus]) -> RolloutStatus:
    by_name = {g.gate: g for g in status.gates} | {g.gate: g for g in gates}
    order = ("kvCapacity", "ttftP95", "preemptionsPerRequest")
    return status.model_copy(update={"gates": [by_name[n] for n in order if n in by_name]})


class _Builder:
    """Accumulates the new status and events of one decision."""

    def __init__(self, status: RolloutStatus, now: datetime.datetime) -> None:
        self.status = status
        self.now = now
        self.stamp = to_rfc3339(now)
        self.events: list[RolloutEvent] = []

    def update(self, **fields: object) -> None:
        self.status = self.status.model_copy(update=fields)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(RolloutEvent(type_, reason, message))

    def phase(
        self, phase: str, reason: str | None, message: str, event: str, **fields: object
    ) -> None:
        self.update(
            phase=phase,
            reason=reason,
            message=message,
            last_transition_time=self.stamp,
            **fields,
        )
        warning = phase in (PAUSED, ABORTED) and reason not in (MANUAL_PAUSE, MANUAL_ABORT)
        self.event("Warning" if warning else "Normal", event, message)


def _start(b: _Builder, spec: RolloutSpec, obs: RolloutObservation, stable: str) -> None:
    first = spec.steps[0].weight
    b.update(
        phase=PROGRESSING,
        stage=STARTING,
        reason=None,
        message=(
            f"rolling out revision {obs.revision} (stable {stable}): waiting for a ready, "
            "measured canary replica"
        ),
        stable_revision=stable,
        canary_revision=obs.revision,
        step=0,
        steps=len(spec.steps),
        weight=0,
        canary_replicas=canary_replicas_for(spec, obs.warm_replicas, first),
        gates=[],
        consecutive_errors=0,
        started_at=b.stamp,
        step_started_at=None,
        last_analysis_at=None,
        failure_counted_at=None,
        last_transition_time=b.stamp,
        canary_unschedulable_since=None,
        drain_started_at=None,
    )


def decide_rollout(
    spec: RolloutSpec, prior: RolloutStatus | None, obs: RolloutObservation
) -> RolloutDecision:
    """The next rollout status for one reconcile (see the module docstring)."""
    status = prior or RolloutStatus(phase=IDLE, stable_revision=obs.revision)
    if status.stable_revision is None:
        status = status.model_copy(update={"stable_revision": obs.revision})
    b = _Builder(status, obs.now)
    stable = status.stable_revision or obs.revision
    fresh = obs.action if obs.action and obs.action != status.handled_action else None
    action = parse_action(fresh)
    if fresh is not None:
        b.update(handled_action=fresh)

    if status.phase in (IDLE, PROMOTED):
        if obs.revision != stable:
            _start(b, spec, obs, stable)
            b.update(handled_action=obs.action)  # a stale annotation never fires
            b.event("Normal", EVENT_STARTED, b.status.message or "")
        elif action is not None:
            b.event("Normal", EVENT_ACTION_IGNORED, f"no rollout in progress: {action!r} ignored")
        return _finish(spec, b, obs)

    if obs.revision == stable:
        b.phase(
            IDLE,
            None,
            f"spec reverted to the stable revision {stable}: canary "
            f"{status.canary_revision} removed",
            EVENT_REVERTED,
            stage=None,
            canary_revision=None,
            step=None,
            weight=0,
            canary_replicas=0,
            gates=[],
        )
        return _finish(spec, b, obs)
    if obs.revision != status.canary_revision:
        old = status.canary_revision
        _start(b, spec, obs, stable)
        b.update(handled_action=status.handled_action if fresh is None else fresh)
        b.event(
            "Normal",
            EVENT_SUPERSEDED,
            f"revision {obs.revision} supersedes canary {old}: back to step 1",
        )
        return _finish(spec, b, obs)

    if action is not None:
        _act(b, spec, obs, action)
    if b.status.phase == PROGRESSING:
        _progress(b, spec, obs)
    return _finish(spec, b, obs)


def _act(b: _Builder, spec: RolloutSpec, obs: RolloutObservation, action: str) -> None:
    st = b.status
    if action == "abort" and st.phase in (PROGRESSING, PAUSED):
        b.phase(ABORTED, MANUAL_ABORT, "aborted by hand: canary scaled to zero", EVENT_ABORTED)
    elif action == "pause" and st.phase == PROGRESSING:
        b.phase(PAUSED, MANUAL_PAUSE, "paused by hand", EVENT_PAUSED)
    elif action == "promote" and st.phase in (PROGRESSING, PAUSED):
        b.phase(
            PROGRESSING,
            None,
            f"promotion of {st.canary_revision} requested by hand: remaining steps skipped",
            EVENT_PROMOTING,
            stage=PROMOTING,
            weight=100,
        )
    elif action == "resume" and st.phase == PAUSED:
        kv_passed = any(g.gate == "kvCapacity" and g.verdict == "Successful" for g in st.gates)
        stage = st.stage if st.stage not in (None, STARTING) or kv_passed else STARTING
        if st.reason == KV_CAPACITY_SHRUNK:
            stage = ANALYZING  # the human accepted the smaller canary
        weight = spec.steps[st.step or 0].weight if stage == ANALYZING else 0
        b.phase(
            PROGRESSING,
            None,
            f"resumed by hand at step {(st.step or 0) + 1}",
            EVENT_RESUMED,
            stage=stage,
            weight=weight,
            step_started_at=b.stamp if stage == ANALYZING else None,
            gates=[g.model_copy(update={"failures": 0}) for g in st.gates],
            consecutive_errors=0,
            canary_unschedulable_since=None,
        )
    elif action == "resume" and st.phase == ABORTED:
        _start(b, spec, obs, st.stable_revision or obs.revision)
        b.update(handled_action=st.handled_action)
        b.event("Normal", EVENT_RESUMED, "restarted by hand after an abort: back to step 1")
    else:
        b.event("Normal", EVENT_ACTION_IGNORED, f"{action!r} does nothing in phase {st.phase}")


def _pause(b: _Builder, reason: str, message: str) -> None:
    b.phase(PAUSED, reason, message, EVENT_PAUSED, weight=0)


def _on_failure(b: _Builder, spec: RolloutSpec, reason: str, message: str) -> None:
    if spec.on_failure == "Abort":
        b.phase(ABORTED, reason, f"{message}; aborted (onFailure: Abort)", EVENT_ABORTED, weight=0)
    else:
        _pause(b, reason, message)


def _unschedulable_too_long(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> bool:
    """Track since when a canary pod is unschedulable; pause once unschedulableTimeout has
    passed (instead of stalling silently). True when it paused."""
    st = b.status
    if not obs.canary_unschedulable:
        if st.canary_unschedulable_since is not None:
            b.update(canary_unschedulable_since=None)
        return False
    since = st.canary_unschedulable_since or b.stamp
    b.update(canary_unschedulable_since=since)
    waited = _elapsed(since, obs.now) or 0.0
    if waited < parse_duration(spec.unschedulable_timeout):
        return False
    _pause(
        b,
        CANARY_UNSCHEDULABLE,
        f"a canary pod of revision {st.canary_revision} has been unschedulable for "
        f"{waited:.0f}s (unschedulableTimeout {spec.unschedulable_timeout})",
    )
    return True


def _kv_gate(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> GateVerdict | None:
    """The KV gate once a canary replica is ready and measured (None before); a failure
    pauses with KVCapacityShrunk unless a human resumed past it."""
    st = b.status
    if obs.canary_ready <= 0 or obs.canary_kv is None:
        return None
    verdict = assess_kv_capacity(obs.stable_kv, obs.canary_kv, spec.gates.min_kv_capacity_ratio)
    accepted = st.stage == ANALYZING and st.reason is None and _kv_accepted(st)
    kv_gate = _gate_status(verdict, st.gates, b.stamp, count_failure=False)
    b.update(gates=_set_gates(b.status, [kv_gate]).gates)
    if isinstance(verdict, Failed) and not accepted:
        _pause(b, KV_CAPACITY_SHRUNK, verdict.message)
    return verdict


def _starting(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """Wait for a ready, measured canary; a KV gate that passes starts step 1."""
    st = b.status
    if obs.canary_ready > 0 and obs.canary_kv is None:
        b.update(
            message=(
                f"canary {st.canary_revision} ready; waiting for its KV measurement "
                "(vllm:cache_config_info in Prometheus) before it gets any traffic"
            )
        )
    verdict = _kv_gate(b, spec, obs)
    if verdict is None or b.status.phase != PROGRESSING or isinstance(verdict, Inconclusive):
        return
    first = spec.steps[0]
    b.update(
        stage=ANALYZING,
        weight=first.weight,
        step_started_at=b.stamp,
        message=f"step 1/{len(spec.steps)}: canary weight {first.weight}% ({verdict.message})",
    )
    b.event("Normal", EVENT_STEP, b.status.message or "")


def _analyzing(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """The KV gate again (the canary may have been re-measured), then the step's analysis."""
    _kv_gate(b, spec, obs)
    if b.status.phase == PROGRESSING:
        _analyze(b, spec, obs)


def _promoting(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """The canary scales to the full warm count; once it is ready, stable drains."""
    st = b.status
    if obs.canary_ready < max(obs.warm_replicas, 1):
        return
    b.update(
        stage=DRAINING,
        drain_started_at=b.stamp,
        message=f"canary {st.canary_revision} carries all traffic: draining stable "
        f"{st.stable_revision}",
    )
    b.event("Normal", EVENT_PROMOTING, b.status.message or "")


def _draining(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """Old stable gets nothing; once it runs nothing (or drainTimeout), it is replaced."""
    st = b.status
    waited = _elapsed(st.drain_started_at, obs.now) or 0.0
    drained = obs.stable_in_flight == 0
    if not drained and waited < parse_duration(spec.drain_timeout):
        return
    how = "drained" if drained else f"drainTimeout {spec.drain_timeout} reached"
    b.update(
        stage=REPLACING,
        message=f"stable {st.stable_revision} {how}: replacing it with {st.canary_revision}",
    )
    b.event("Normal", EVENT_PROMOTING, b.status.message or "")


def _replacing(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """The stable Deployment gets the new revision; once it is ready, the canary drains."""
    if not obs.stable_updated:
        return
    b.update(
        stage=DRAINING_CANARY,
        weight=0,
        drain_started_at=b.stamp,
        message=(
            f"stable runs {b.status.canary_revision} and takes all traffic: draining the canary"
        ),
    )
    b.event("Normal", EVENT_PROMOTING, b.status.message or "")


def _draining_canary(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """The canary finishes its requests (or drainTimeout); then the rollout is Promoted."""
    st = b.status
    waited = _elapsed(st.drain_started_at, obs.now) or 0.0
    if obs.canary_in_flight != 0 and waited < parse_duration(spec.drain_timeout):
        return
    b.phase(
        PROMOTED,
        None,
        f"revision {st.canary_revision} promoted to stable (was {st.stable_revision})",
        EVENT_PROMOTED,
        stage=None,
        stable_revision=st.canary_revision,
        canary_revision=None,
        step=None,
        weight=0,
        canary_replicas=0,
        drain_started_at=None,
    )


StageStep = Callable[[_Builder, RolloutSpec, RolloutObservation], None]

# What one reconcile does in each stage of a progressing rollout (the module docstring's
# table, in the same order).
STAGE_STEPS: dict[RolloutStage, StageStep] = {
    STARTING: _starting,
    ANALYZING: _analyzing,
    PROMOTING: _promoting,
    DRAINING: _draining,
    REPLACING: _replacing,
    DRAINING_CANARY: _draining_canary,
}


def _progress(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    if _unschedulable_too_long(b, spec, obs):
        return
    step = STAGE_STEPS.get(b.status.stage) if b.status.stage is not None else None
    if step is not None:
        step(b, spec, obs)


def _kv_accepted(st: RolloutStatus) -> bool:
    """A human resumed past a KV shortfall (the KV gate failed yet the steps run)."""
    kv = next((g for g in st.gates if g.gate == "kvCapacity"), None)
    return kv is not None and kv.verdict == "Failed"


def _analyze(b: _Builder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    st = b.status
    interval = parse_duration(spec.analysis_interval)
    # the first analysis of a step comes an interval after the step began (a few first
    # requests of a cold canary are no verdict), the next ones an interval apart
    since = _elapsed(st.last_analysis_at or st.step_started_at, obs.now)
    if obs.analysis is None or (since is not None and since < interval):
        return
    a, g = obs.analysis, spec.gates
    ttft = assess_ttft(a.stable_ttft, a.canary_ttft, g.max_ttft_p95_ratio, g.min_samples, a.error)
    pre = assess_preemptions(
        a.stable_preemptions,
        a.canary_preemptions,
        g.max_preemption_rate_ratio,
        g.min_samples,
        a.error,
    )
    # a window reaching back before the last counted failure holds the samples that failed
    # then: failing again on them is the same evidence, not a new failure
    last_counted = parse_rfc3339(st.failure_counted_at)
    new_evidence = last_counted is None or a.since is None or a.since >= last_counted
    gates = [_gate_status(v, st.gates, b.stamp, new_evidence) for v in (ttft, pre)]
    errors = st.consecutive_errors + 1 if a.error is not None else 0
    b.update(gates=_set_gates(st, gates).gates, consecutive_errors=errors, last_analysis_at=b.stamp)
    if new_evidence and any(isinstance(v, Failed) for v in (ttft, pre)):
        b.update(failure_counted_at=b.stamp)
    if errors > spec.consecutive_error_limit:
        _pause(
            b,
            METRICS_UNAVAILABLE,
            f"{errors} analyses in a row without metrics (consecutiveErrorLimit "
            f"{spec.consecutive_error_limit}): {a.error}",
        )
        return
    for verdict, gate in ((ttft, gates[0]), (pre, gates[1])):
        if isinstance(verdict, Failed) and new_evidence:
            b.event("Warning", EVENT_GATE_FAILED, f"{verdict.message} (failure {gate.failures})")
            if gate.failures > spec.failure_limit:
                _on_failure(
                    b,
                    spec,
                    verdict.reason,
                    f"{verdict.message}; {gate.failures} failed analyses "
                    f"(failureLimit {spec.failure_limit})",
                )
                return
    step = st.step or 0
    elapsed = _elapsed(st.step_started_at, obs.now) or 0.0
    if elapsed < parse_duration(spec.steps[step].pause) or a.error is not None:
        return
    verdicts = (ttft, pre)
    if all(isinstance(v, Successful) for v in verdicts):
        if step + 1 < len(spec.steps):
            weight = spec.steps[step + 1].weight
            b.update(
                step=step + 1,
                weight=weight,
                canary_replicas=canary_replicas_for(spec, obs.warm_replicas, weight),
                step_started_at=b.stamp,
                message=f"step {step + 2}/{len(spec.steps)}: canary weight {weight}%",
            )
            b.event("Normal", EVENT_STEP, b.status.message or "")
        else:
            b.update(
                stage=PROMOTING,
                weight=100,
                message=f"every step passed: promoting {st.canary_revision}",
            )
            b.event("Normal", EVENT_PROMOTING, b.status.message or "")
        return
    inconclusive = next((v for v in verdicts if isinstance(v, Inconclusive)), None)
    if inconclusive is not None:
        _pause(b, INCONCLUSIVE, f"step {step + 1} ended without a verdict: {inconclusive.message}")


def _finish(spec: RolloutSpec, b: _Builder, obs: RolloutObservation) -> RolloutDecision:
    actions = actions_of(spec, b.status, obs.warm_replicas)
    if b.status.canary_replicas != actions.canary_replicas and b.status.phase != IDLE:
        b.update(canary_replicas=actions.canary_replicas)
    return RolloutDecision(b.status, actions, tuple(b.events))


__all__ = [
    "RolloutActions",
    "RolloutDecision",
    "RolloutEvent",
    "RolloutObservation",
    "WindowAnalysis",
    "actions_of",
    "canary_replicas_for",
    "decide_rollout",
    "parse_action",
]
