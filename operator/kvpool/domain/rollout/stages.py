"""One reconcile of a progressing rollout, stage by stage: what the state machine does in
``Starting``, ``Analyzing``, ``Promoting``, ``Draining``, ``ReplacingStable`` and
``DrainingCanary``.

Why it exists: the state machine (:mod:`kvpool.domain.rollout.machine`) first settles
what changes a rollout from outside (a new or reverted revision, a user action); what is
left for a rollout still ``Progressing`` is the step of its stage, :func:`progress`,
looked up in :data:`STAGE_STEPS`. Each step reads only the spec, the builder's status and
this reconcile's observation, so a stage can be read (and tested) on its own. The stages, the
gates they apply and when they pause are drawn in the machine's module docstring and
docs/0006-rollouts.md.

Whatever the stage, a canary pod unschedulable for longer than ``unschedulableTimeout``
pauses the rollout first (``CanaryUnschedulable``) instead of letting it stall silently.
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.api.common import parse_duration
from kvpool.api.rollout import RolloutSpec, RolloutStage, RolloutStatus
from kvpool.domain.rollout.builder import DecisionBuilder
from kvpool.domain.rollout.children import canary_replicas_for
from kvpool.domain.rollout.gate_records import gate_record, with_gates
from kvpool.domain.rollout.gates import (
    INCONCLUSIVE,
    KV_CAPACITY_SHRUNK,
    METRICS_UNAVAILABLE,
    Failed,
    GateVerdict,
    Inconclusive,
    Successful,
    assess_kv_capacity,
    assess_preemptions,
    assess_ttft,
)
from kvpool.domain.rollout.model import RolloutObservation
from kvpool.domain.rollout.timing import parse_rfc3339, seconds_since
from kvpool.domain.rollout.vocabulary import (
    ABORTED,
    ANALYZING,
    CANARY_UNSCHEDULABLE,
    DRAINING,
    DRAINING_CANARY,
    EVENT_ABORTED,
    EVENT_GATE_FAILED,
    EVENT_PAUSED,
    EVENT_PROMOTED,
    EVENT_PROMOTING,
    EVENT_STEP,
    PAUSED,
    PROGRESSING,
    PROMOTED,
    PROMOTING,
    REPLACING,
    STARTING,
)


def _pause(b: DecisionBuilder, reason: str, message: str) -> None:
    b.phase(PAUSED, reason, message, EVENT_PAUSED, weight=0)


def _on_failure(b: DecisionBuilder, spec: RolloutSpec, reason: str, message: str) -> None:
    if spec.on_failure == "Abort":
        b.phase(ABORTED, reason, f"{message}; aborted (onFailure: Abort)", EVENT_ABORTED, weight=0)
    else:
        _pause(b, reason, message)


def _unschedulable_too_long(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> bool:
    """Track since when a canary pod is unschedulable; pause once unschedulableTimeout has
    passed (instead of stalling silently). True when it paused."""
    st = b.status
    if not obs.canary_unschedulable:
        if st.canary_unschedulable_since is not None:
            b.update(canary_unschedulable_since=None)
        return False
    since = st.canary_unschedulable_since or b.stamp
    b.update(canary_unschedulable_since=since)
    waited = seconds_since(since, obs.now) or 0.0
    if waited < parse_duration(spec.unschedulable_timeout):
        return False
    _pause(
        b,
        CANARY_UNSCHEDULABLE,
        f"a canary pod of revision {st.canary_revision} has been unschedulable for "
        f"{waited:.0f}s (unschedulableTimeout {spec.unschedulable_timeout})",
    )
    return True


def _kv_gate(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> GateVerdict | None:
    """The KV gate once a canary replica is ready and measured (None before); a failure
    pauses with KVCapacityShrunk unless a human resumed past it."""
    st = b.status
    if obs.canary_ready <= 0 or obs.canary_kv is None:
        return None
    verdict = assess_kv_capacity(obs.stable_kv, obs.canary_kv, spec.gates.min_kv_capacity_ratio)
    accepted = st.stage == ANALYZING and st.reason is None and _kv_accepted(st)
    kv_gate = gate_record(verdict, st.gates, b.stamp, count_failure=False)
    b.update(gates=with_gates(b.status, [kv_gate]).gates)
    if isinstance(verdict, Failed) and not accepted:
        _pause(b, KV_CAPACITY_SHRUNK, verdict.message)
    return verdict


def _starting(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
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


def _analyzing(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """The KV gate again (the canary may have been re-measured), then the step's analysis."""
    _kv_gate(b, spec, obs)
    if b.status.phase == PROGRESSING:
        _analyze(b, spec, obs)


def _promoting(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
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


def _draining(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """Old stable gets nothing; once it runs nothing (or drainTimeout), it is replaced."""
    st = b.status
    waited = seconds_since(st.drain_started_at, obs.now) or 0.0
    drained = obs.stable_in_flight == 0
    if not drained and waited < parse_duration(spec.drain_timeout):
        return
    how = "drained" if drained else f"drainTimeout {spec.drain_timeout} reached"
    b.update(
        stage=REPLACING,
        message=f"stable {st.stable_revision} {how}: replacing it with {st.canary_revision}",
    )
    b.event("Normal", EVENT_PROMOTING, b.status.message or "")


def _replacing(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
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


def _draining_canary(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """The canary finishes its requests (or drainTimeout); then the rollout is Promoted."""
    st = b.status
    waited = seconds_since(st.drain_started_at, obs.now) or 0.0
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


StageStep = Callable[[DecisionBuilder, RolloutSpec, RolloutObservation], None]

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


def progress(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    """One reconcile of a progressing rollout: the unschedulable check, then its stage."""
    if _unschedulable_too_long(b, spec, obs):
        return
    step = STAGE_STEPS.get(b.status.stage) if b.status.stage is not None else None
    if step is not None:
        step(b, spec, obs)


def _kv_accepted(st: RolloutStatus) -> bool:
    """A human resumed past a KV shortfall (the KV gate failed yet the steps run)."""
    kv = next((g for g in st.gates if g.gate == "kvCapacity"), None)
    return kv is not None and kv.verdict == "Failed"


def _analyze(b: DecisionBuilder, spec: RolloutSpec, obs: RolloutObservation) -> None:
    st = b.status
    interval = parse_duration(spec.analysis_interval)
    # the first analysis of a step comes an interval after the step began (a few first
    # requests of a cold canary are no verdict), the next ones an interval apart
    since = seconds_since(st.last_analysis_at or st.step_started_at, obs.now)
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
    gates = [gate_record(v, st.gates, b.stamp, new_evidence) for v in (ttft, pre)]
    errors = st.consecutive_errors + 1 if a.error is not None else 0
    b.update(gates=with_gates(st, gates).gates, consecutive_errors=errors, last_analysis_at=b.stamp)
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
    elapsed = seconds_since(st.step_started_at, obs.now) or 0.0
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
