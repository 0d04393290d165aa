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

Where the parts live: this module settles what changes a rollout from outside (a new or
reverted revision, a user action) and hands a rollout still progressing to its stage's
step (:mod:`~kvpool.domain.rollout.stages`, written through
:mod:`~kvpool.domain.rollout.builder`). The names it writes are in
:mod:`~kvpool.domain.rollout.vocabulary`, the values it reads and returns in
:mod:`~kvpool.domain.rollout.model`, the children a status implies in
:mod:`~kvpool.domain.rollout.children`, the gate records in
:mod:`~kvpool.domain.rollout.gate_records`, the stamps in
:mod:`~kvpool.domain.rollout.timing` and the user actions in
:mod:`~kvpool.domain.rollout.actions`.

Worked example (steps 10% then 50%, stable 4 warm replicas, minKVCapacityRatio 0.9):
revision b replaces a -> Progressing/Starting, canary 1 replica, weight 0; the canary
reports 1,024 KV tokens against stable's 2,048 -> ratio 0.50 < 0.9 -> Paused
KVCapacityShrunk, weight stays 0; ``kvpool.dev/rollout=abort`` -> Aborted, canary scaled
to 0; reverting the spec to a -> Idle.
"""

from __future__ import annotations

from kvpool.api.rollout import RolloutSpec, RolloutStatus
from kvpool.domain.rollout.actions import parse_action
from kvpool.domain.rollout.builder import DecisionBuilder
from kvpool.domain.rollout.children import actions_of, canary_replicas_for
from kvpool.domain.rollout.gates import KV_CAPACITY_SHRUNK
from kvpool.domain.rollout.model import RolloutDecision, RolloutObservation
from kvpool.domain.rollout.stages import progress
from kvpool.domain.rollout.vocabulary import (
    ABORTED,
    ANALYZING,
    EVENT_ABORTED,
    EVENT_ACTION_IGNORED,
    EVENT_PAUSED,
    EVENT_PROMOTING,
    EVENT_RESUMED,
    EVENT_REVERTED,
    EVENT_STARTED,
    EVENT_SUPERSEDED,
    IDLE,
    MANUAL_ABORT,
    MANUAL_PAUSE,
    PAUSED,
    PROGRESSING,
    PROMOTED,
    PROMOTING,
    STARTING,
)


def _start(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation, stable: str) -> None:
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
    b = DecisionBuilder(status, obs.now)
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
        progress(b, spec, obs)
    return _finish(spec, b, obs)


def _act(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation, action: str) -> None:
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


def _finish(spec: RolloutSpec, b: DecisionBuilder, obs: RolloutObservation) -> RolloutDecision:
    actions = actions_of(spec, b.status, obs.warm_replicas)
    if b.status.canary_replicas != actions.canary_replicas and b.status.phase != IDLE:
        b.update(canary_replicas=actions.canary_replicas)
    return RolloutDecision(b.status, actions, tuple(b.events))


__all__ = ["decide_rollout"]
