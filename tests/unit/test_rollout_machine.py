"""The rollout state machine as tables of cases (kvpool.domain.rollout.machine)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from typing import Any

import pytest

from kvpool.api.rollout import GateStatus, RolloutSpec, RolloutStatus, RolloutStep
from kvpool.domain.rollout.children import actions_of
from kvpool.domain.rollout.gates import TrackSample
from kvpool.domain.rollout.machine import decide_rollout
from kvpool.domain.rollout.model import RolloutObservation, WindowAnalysis
from kvpool.domain.rollout.timing import seconds_to_next_analysis

T0 = datetime.datetime(2026, 12, 1, 10, 0, 0, tzinfo=datetime.UTC)
STAMP0 = "2026-12-01T10:00:00Z"


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def spec(**kw: Any) -> RolloutSpec:
    base: dict[str, Any] = {
        "steps": [RolloutStep(weight=10, pause="60s"), RolloutStep(weight=50, pause="60s")],
        "analysis_interval": "10s",
    }
    return RolloutSpec(**(base | kw))


def obs(**kw: Any) -> RolloutObservation:
    base: dict[str, Any] = {
        "revision": "new",
        "warm_replicas": 4,
        "canary_ready": 1,
        "stable_kv": 2048,
        "canary_kv": 2048,
        "canary_unschedulable": False,
        "analysis": None,
        "stable_in_flight": None,
        "stable_updated": False,
        "action": None,
        "now": T0,
    }
    return RolloutObservation(**(base | kw))


GOOD = WindowAnalysis(
    stable_ttft=TrackSample(0.5, 400),
    canary_ttft=TrackSample(0.52, 150),
    stable_preemptions=TrackSample(0.0, 400),
    canary_preemptions=TrackSample(0.0, 150),
)
SLOW = replace(GOOD, canary_ttft=TrackSample(1.5, 150))
THIN = replace(GOOD, canary_ttft=TrackSample(0.5, 20), canary_preemptions=TrackSample(0.0, 20))
DOWN = WindowAnalysis(error="Prometheus unreachable")


def status(**kw: Any) -> RolloutStatus:
    base: dict[str, Any] = {
        "phase": "Progressing",
        "stage": "Analyzing",
        "stable_revision": "old",
        "canary_revision": "new",
        "step": 0,
        "steps": 2,
        "weight": 10,
        "canary_replicas": 1,
        "started_at": STAMP0,
        "step_started_at": STAMP0,
        "gates": [
            GateStatus(gate="kvCapacity", verdict="Successful", reason="Successful", threshold=0.9)
        ],
    }
    return RolloutStatus(**(base | kw))


@dataclass(frozen=True)
class Case:
    """One decision: from ``prior`` and ``observation`` (under ``spec``, default
    :func:`spec`) to the expected status fields, children and Events."""

    id: str
    prior: RolloutStatus | None
    observation: RolloutObservation
    phase: str
    stage: str | None = None
    reason: str | None = None
    weight: int = 0  # status.weight and the config's canary weight
    step: int | None = None
    canary_replicas: int = 0  # what the canary Deployment is set to
    events: tuple[str, ...] = ()  # reasons, in order
    spec: RolloutSpec | None = None


CASES = [
    Case(
        id="first-sight-idle",
        prior=None,
        observation=obs(revision="old"),
        phase="Idle",
        weight=0,
        canary_replicas=0,
        events=(),
    ),
    Case(
        id="spec-change-starts-canary-at-weight-0",
        prior=RolloutStatus(phase="Idle", stable_revision="old"),
        observation=obs(canary_ready=0, canary_kv=None),
        phase="Progressing",
        stage="Starting",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutStarted",),
    ),
    Case(
        id="waits-for-a-ready-canary",
        prior=status(stage="Starting", weight=0, gates=[]),
        observation=obs(canary_ready=0, canary_kv=None),
        phase="Progressing",
        stage="Starting",
        weight=0,
        step=0,
        canary_replicas=1,
        events=(),
    ),
    Case(
        id="kv-shrunk-pauses-before-any-weight",
        prior=status(stage="Starting", weight=0, gates=[]),
        observation=obs(canary_kv=1024),
        phase="Paused",
        stage="Starting",
        reason="KVCapacityShrunk",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutPaused",),
    ),
    Case(
        id="kv-ok-gives-first-step-weight",
        prior=status(stage="Starting", weight=0, gates=[]),
        observation=obs(canary_kv=2048),
        phase="Progressing",
        stage="Analyzing",
        weight=10,
        step=0,
        canary_replicas=1,
        events=("RolloutStep",),
    ),
    Case(
        id="healthy-mid-step-holds",
        prior=status(),
        observation=obs(analysis=GOOD, now=at(30)),
        phase="Progressing",
        stage="Analyzing",
        weight=10,
        step=0,
        canary_replicas=1,
        events=(),
    ),
    Case(
        id="healthy-step-end-advances-and-scales-canary",
        prior=status(),
        observation=obs(analysis=GOOD, now=at(60)),
        phase="Progressing",
        stage="Analyzing",
        weight=50,
        step=1,
        canary_replicas=2,
        events=("RolloutStep",),
    ),
    Case(
        id="last-step-passed-promotes-at-full-size",
        prior=status(step=1, weight=50, canary_replicas=2),
        observation=obs(analysis=GOOD, now=at(60)),
        phase="Progressing",
        stage="Promoting",
        weight=100,
        step=1,
        canary_replicas=4,
        events=("RolloutPromoting",),
    ),
    Case(
        id="ttft-failure-limit-0-pauses",
        prior=status(),
        observation=obs(analysis=SLOW, now=at(30)),
        phase="Paused",
        stage="Analyzing",
        reason="TTFTRegressed",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutGateFailed", "RolloutPaused"),
    ),
    Case(
        id="ttft-failure-onfailure-abort",
        prior=status(),
        observation=obs(analysis=SLOW, now=at(30)),
        phase="Aborted",
        stage="Analyzing",
        reason="TTFTRegressed",
        weight=0,
        step=0,
        canary_replicas=0,
        events=("RolloutGateFailed", "RolloutAborted"),
        spec=spec(on_failure="Abort"),
    ),
    Case(
        id="first-failure-within-limit-holds",
        prior=status(),
        observation=obs(analysis=SLOW, now=at(30)),
        phase="Progressing",
        stage="Analyzing",
        weight=10,
        step=0,
        canary_replicas=1,
        events=("RolloutGateFailed",),
        spec=spec(failure_limit=1),
    ),
    Case(
        id="failure-limit-reached-pauses",
        prior=status(
            gates=[
                GateStatus(
                    gate="ttftP95",
                    verdict="Failed",
                    reason="TTFTRegressed",
                    threshold=1.2,
                    failures=1,
                )
            ]
        ),
        observation=obs(analysis=SLOW, now=at(30)),
        phase="Paused",
        stage="Analyzing",
        reason="TTFTRegressed",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutGateFailed", "RolloutPaused"),
        spec=spec(failure_limit=1),
    ),
    Case(
        id="failed-at-step-end-within-limit-never-advances",
        prior=status(),
        observation=obs(analysis=SLOW, now=at(60)),
        phase="Progressing",
        stage="Analyzing",
        weight=10,
        step=0,
        canary_replicas=1,
        events=("RolloutGateFailed",),
        spec=spec(failure_limit=3),
    ),
    Case(
        id="too-few-samples-at-step-end-pauses-inconclusive",
        prior=status(),
        observation=obs(analysis=THIN, now=at(60)),
        phase="Paused",
        stage="Analyzing",
        reason="Inconclusive",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutPaused",),
    ),
    Case(
        id="prometheus-down-within-error-budget-holds-never-advances",
        prior=status(),
        observation=obs(analysis=DOWN, now=at(60)),
        phase="Progressing",
        stage="Analyzing",
        weight=10,
        step=0,
        canary_replicas=1,
        events=(),
    ),
    Case(
        id="error-budget-spent-pauses-metrics-unavailable",
        prior=status(consecutive_errors=4),
        observation=obs(analysis=DOWN, now=at(60)),
        phase="Paused",
        stage="Analyzing",
        reason="MetricsUnavailable",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutPaused",),
    ),
    Case(
        id="analysis-not-due-counts-nothing",
        prior=status(last_analysis_at="2026-12-01T10:00:25Z"),
        observation=obs(analysis=SLOW, now=at(30)),
        phase="Progressing",
        stage="Analyzing",
        weight=10,
        step=0,
        canary_replicas=1,
        events=(),
    ),
    Case(
        id="unschedulable-past-timeout-pauses",
        prior=status(stage="Starting", weight=0, canary_unschedulable_since=STAMP0),
        observation=obs(canary_ready=0, canary_kv=None, canary_unschedulable=True, now=at(601)),
        phase="Paused",
        stage="Starting",
        reason="CanaryUnschedulable",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutPaused",),
    ),
    Case(
        id="unschedulable-within-timeout-waits",
        prior=status(stage="Starting", weight=0),
        observation=obs(canary_ready=0, canary_kv=None, canary_unschedulable=True, now=at(30)),
        phase="Progressing",
        stage="Starting",
        weight=0,
        step=0,
        canary_replicas=1,
        events=(),
    ),
    Case(
        id="revert-to-stable-ends-rollout",
        prior=status(phase="Paused", reason="KVCapacityShrunk", weight=0),
        observation=obs(revision="old"),
        phase="Idle",
        weight=0,
        canary_replicas=0,
        events=("RolloutReverted",),
    ),
    Case(
        id="new-change-supersedes-canary",
        prior=status(step=1, weight=50),
        observation=obs(revision="newer", canary_ready=0, canary_kv=None),
        phase="Progressing",
        stage="Starting",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutSuperseded",),
    ),
    Case(
        id="abort-by-annotation-scales-canary-to-zero",
        prior=status(phase="Paused", reason="KVCapacityShrunk", weight=0, stage="Starting"),
        observation=obs(canary_kv=1024, action="abort"),
        phase="Aborted",
        stage="Starting",
        reason="ManualAbort",
        weight=0,
        step=0,
        canary_replicas=0,
        events=("RolloutAborted",),
    ),
    Case(
        id="handled-annotation-does-not-fire-again",
        prior=status(
            phase="Paused",
            reason="KVCapacityShrunk",
            weight=0,
            stage="Starting",
            handled_action="abort",
        ),
        observation=obs(canary_kv=1024, action="abort"),
        phase="Paused",
        stage="Starting",
        reason="KVCapacityShrunk",
        weight=0,
        step=0,
        canary_replicas=1,
        events=(),
    ),
    Case(
        id="resume-past-kv-shortfall-accepts-it",
        prior=status(
            phase="Paused",
            reason="KVCapacityShrunk",
            weight=0,
            stage="Starting",
            gates=[
                GateStatus(
                    gate="kvCapacity", verdict="Failed", reason="KVCapacityShrunk", threshold=0.9
                )
            ],
        ),
        observation=obs(canary_kv=1024, action="resume", now=at(5)),
        phase="Progressing",
        stage="Analyzing",
        weight=10,
        step=0,
        canary_replicas=1,
        events=("RolloutResumed",),
    ),
    Case(
        id="promote-by-hand",
        prior=status(phase="Paused", reason="TTFTRegressed", weight=0),
        observation=obs(action="promote@1"),
        phase="Progressing",
        stage="Promoting",
        weight=100,
        step=0,
        canary_replicas=4,
        events=("RolloutPromoting",),
    ),
    Case(
        id="resume-after-abort-restarts",
        prior=status(phase="Aborted", reason="ManualAbort", weight=0, canary_replicas=0),
        observation=obs(action="resume@2", canary_ready=0, canary_kv=None),
        phase="Progressing",
        stage="Starting",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutResumed",),
    ),
    Case(
        id="manual-pause-keeps-weight",
        prior=status(),
        observation=obs(action="pause", analysis=GOOD, now=at(60)),
        phase="Paused",
        stage="Analyzing",
        reason="ManualPause",
        weight=10,
        step=0,
        canary_replicas=1,
        events=("RolloutPaused",),
    ),
    Case(
        id="stale-annotation-at-start-is-recorded-not-acted-on",
        prior=RolloutStatus(phase="Idle", stable_revision="old", handled_action=None),
        observation=obs(action="abort", canary_ready=0, canary_kv=None),
        phase="Progressing",
        stage="Starting",
        weight=0,
        step=0,
        canary_replicas=1,
        events=("RolloutStarted",),
    ),
    Case(
        id="full-canary-ready-drains-stable",
        prior=status(stage="Promoting", weight=100, canary_replicas=4),
        observation=obs(canary_ready=4),
        phase="Progressing",
        stage="Draining",
        weight=100,
        step=0,
        canary_replicas=4,
        events=("RolloutPromoting",),
    ),
    Case(
        id="stable-still-busy-keeps-draining",
        prior=status(stage="Draining", weight=100, canary_replicas=4, drain_started_at=STAMP0),
        observation=obs(canary_ready=4, stable_in_flight=3, now=at(10)),
        phase="Progressing",
        stage="Draining",
        weight=100,
        step=0,
        canary_replicas=4,
        events=(),
    ),
    Case(
        id="stable-drained-is-replaced",
        prior=status(stage="Draining", weight=100, canary_replicas=4, drain_started_at=STAMP0),
        observation=obs(canary_ready=4, stable_in_flight=0, now=at(10)),
        phase="Progressing",
        stage="ReplacingStable",
        weight=100,
        step=0,
        canary_replicas=4,
        events=("RolloutPromoting",),
    ),
    Case(
        id="drain-timeout-without-metrics",
        prior=status(stage="Draining", weight=100, canary_replicas=4, drain_started_at=STAMP0),
        observation=obs(canary_ready=4, stable_in_flight=None, now=at(121)),
        phase="Progressing",
        stage="ReplacingStable",
        weight=100,
        step=0,
        canary_replicas=4,
        events=("RolloutPromoting",),
    ),
    Case(
        id="stable-not-yet-on-new-revision-waits",
        prior=status(stage="ReplacingStable", weight=100, canary_replicas=4),
        observation=obs(canary_ready=4, stable_updated=False),
        phase="Progressing",
        stage="ReplacingStable",
        weight=100,
        step=0,
        canary_replicas=4,
        events=(),
    ),
    Case(
        id="stable-on-new-revision-takes-traffic-canary-drains",
        prior=status(stage="ReplacingStable", weight=100, canary_replicas=4),
        observation=obs(canary_ready=4, stable_updated=True),
        phase="Progressing",
        stage="DrainingCanary",
        weight=0,
        step=0,
        canary_replicas=4,
        events=("RolloutPromoting",),
    ),
    Case(
        id="canary-still-busy-kept",
        prior=status(stage="DrainingCanary", weight=0, canary_replicas=4, drain_started_at=STAMP0),
        observation=obs(canary_ready=4, canary_in_flight=2, now=at(10)),
        phase="Progressing",
        stage="DrainingCanary",
        weight=0,
        step=0,
        canary_replicas=4,
        events=(),
    ),
    Case(
        id="canary-drained-promoted",
        prior=status(stage="DrainingCanary", weight=0, canary_replicas=4, drain_started_at=STAMP0),
        observation=obs(canary_ready=4, canary_in_flight=0, now=at(10)),
        phase="Promoted",
        weight=0,
        canary_replicas=0,
        events=("RolloutPromoted",),
    ),
    Case(
        id="canary-drain-timeout-promoted",
        prior=status(stage="DrainingCanary", weight=0, canary_replicas=4, drain_started_at=STAMP0),
        observation=obs(canary_ready=4, canary_in_flight=None, now=at(121)),
        phase="Promoted",
        weight=0,
        canary_replicas=0,
        events=("RolloutPromoted",),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_state_machine(case: Case) -> None:
    rollout = case.spec or spec()
    decision = decide_rollout(rollout, case.prior, case.observation)
    st = decision.status
    assert (st.phase, st.stage, st.reason) == (case.phase, case.stage, case.reason)
    assert decision.actions.weight == case.weight and st.weight == case.weight
    assert st.step == case.step
    assert decision.actions.canary_replicas == case.canary_replicas
    assert tuple(e.reason for e in decision.events) == case.events
    # restart safety: the children follow from the status alone
    assert actions_of(rollout, st, case.observation.warm_replicas) == decision.actions


def test_kv_pause_message_has_both_figures_and_ratio() -> None:
    d = decide_rollout(spec(), status(stage="Starting", weight=0, gates=[]), obs(canary_kv=1024))
    assert "1024" in (d.status.message or "") and "2048" in (d.status.message or "")
    assert "0.50" in (d.status.message or "")
    kv = d.status.gates[0]
    assert (kv.gate, kv.stable, kv.canary, kv.ratio, kv.verdict) == (
        "kvCapacity",
        2048,
        1024,
        0.5,
        "Failed",
    )


def test_gates_record_figures_samples_and_running_failures() -> None:
    d = decide_rollout(spec(failure_limit=5), status(), obs(analysis=SLOW, now=at(30)))
    ttft = next(g for g in d.status.gates if g.gate == "ttftP95")
    assert (ttft.stable, ttft.canary, ttft.stable_samples, ttft.canary_samples) == (
        0.5,
        1.5,
        400,
        150,
    )
    assert (ttft.verdict, ttft.failures, ttft.threshold) == ("Failed", 1, 1.2)
    again = decide_rollout(spec(failure_limit=5), d.status, obs(analysis=SLOW, now=at(45)))
    assert next(g for g in again.status.gates if g.gate == "ttftP95").failures == 2


def test_same_inputs_twice_decide_the_same_after_a_restart() -> None:
    """An operator killed after writing status recomputes nothing new from it."""
    first = decide_rollout(spec(), status(), obs(analysis=GOOD, now=at(60)))
    again = decide_rollout(spec(), first.status, obs(analysis=GOOD, now=at(61)))
    assert again.status.step == first.status.step == 1
    assert again.actions == first.actions
    assert again.events == ()


def test_promotion_never_skips_a_step_without_analysis() -> None:
    """At step end with no analysis this reconcile, the step is held."""
    d = decide_rollout(spec(), status(), obs(analysis=None, now=at(600)))
    assert (d.status.step, d.status.weight) == (0, 10)


def test_max_surge_bounds_canary_replicas() -> None:
    d = decide_rollout(
        spec(max_surge=1), status(), obs(analysis=GOOD, now=at(60), warm_replicas=10)
    )
    assert d.status.step == 1 and d.actions.canary_replicas == 1


@pytest.mark.parametrize(
    ("phase", "stage", "last", "expected"),
    [
        ("Progressing", "Analyzing", "2026-01-01T00:00:00Z", 5.0),
        ("Progressing", "Analyzing", None, 13.0),
        ("Progressing", "Analyzing", "2025-12-31T23:59:00Z", 0.0),
        ("Progressing", "Starting", None, None),
        ("Paused", "Analyzing", "2026-01-01T00:00:00Z", None),
    ],
    ids=[
        "due-an-interval-after-the-last-analysis",
        "first-analysis-of-a-step-is-due-an-interval-after-it-began",
        "overdue-is-due-now",
        "no-analysis-before-the-step-analyses",
        "a-paused-rollout-analyses-nothing",
    ],
)
def test_seconds_to_next_analysis(
    phase: str, stage: str, last: str | None, expected: float | None
) -> None:
    now = datetime.datetime(2026, 1, 1, 0, 0, 10, tzinfo=datetime.UTC)
    status = RolloutStatus(
        phase=phase, stage=stage, last_analysis_at=last, step_started_at="2026-01-01T00:00:08Z"
    )
    spec = RolloutSpec(analysis_interval="15s")
    assert seconds_to_next_analysis(spec, status, now) == expected


class TestFailuresCountOncePerEvidence:
    """Analyses whose windows overlap see the same samples: a burst of slow requests fails
    each of them, but it is one failure, not one per analysis (else failureLimit could not
    tolerate a single noisy moment)."""

    def failed_once(self) -> RolloutStatus:
        d = decide_rollout(
            spec(failure_limit=1), status(), obs(analysis=replace(SLOW, since=at(-20)), now=at(10))
        )
        assert d.status.failure_counted_at == "2026-12-01T10:00:10Z"
        assert next(g for g in d.status.gates if g.gate == "ttftP95").failures == 1
        return d.status

    @pytest.mark.parametrize(
        ("since", "now", "failures", "phase", "events"),
        [
            pytest.param(5, 20, 1, "Progressing", (), id="window-holds-the-failed-samples"),
            pytest.param(10, 40, 2, "Paused", ("RolloutGateFailed", "RolloutPaused"), id="new"),
            pytest.param(
                None, 20, 2, "Paused", ("RolloutGateFailed", "RolloutPaused"), id="unknown"
            ),
        ],
    )
    def test_a_failure_counts_only_on_samples_after_the_last(
        self,
        since: float | None,
        now: float,
        failures: int,
        phase: str,
        events: tuple[str, ...],
    ) -> None:
        window = replace(SLOW, since=None if since is None else at(since))
        d = decide_rollout(
            spec(failure_limit=1), self.failed_once(), obs(analysis=window, now=at(now))
        )
        ttft = next(g for g in d.status.gates if g.gate == "ttftP95")
        assert (ttft.verdict, ttft.failures, d.status.phase) == ("Failed", failures, phase)
        assert tuple(e.reason for e in d.events) == events
        assert ("not counted" in (ttft.message or "")) == (failures == 1)

    def test_an_uncounted_failure_still_holds_the_step(self) -> None:
        """At the step's end a window that still fails never advances, counted or not."""
        window = replace(SLOW, since=at(5))
        d = decide_rollout(
            spec(failure_limit=1), self.failed_once(), obs(analysis=window, now=at(60))
        )
        assert (d.status.phase, d.status.step, d.status.weight) == ("Progressing", 0, 10)

    def test_a_new_rollout_forgets_the_last_failure(self) -> None:
        prior = self.failed_once().model_copy(update={"phase": "Aborted"})
        d = decide_rollout(spec(), prior, obs(revision="newer"))
        assert d.status.failure_counted_at is None
