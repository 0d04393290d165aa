"""The plugin's action check agrees with the state machine (kvpool.domain.rollout.actions).

For every phase and action, the machine is handed the action as a fresh annotation; it
either acts (the phase, stage or weight changes, no ``RolloutActionIgnored`` Event) or
ignores it (that Event). ``assess_action`` must say the same, so ``kubectl kvpool`` refuses
exactly the actions the operator would ignore.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from kvpool.api.rollout import RolloutSpec, RolloutStatus, RolloutStep
from kvpool.domain.rollout.actions import ACTION_PHASES, ACTIONS, assess_action
from kvpool.domain.rollout.machine import decide_rollout
from kvpool.domain.rollout.model import RolloutObservation
from kvpool.domain.rollout.vocabulary import EVENT_ACTION_IGNORED

T0 = datetime.datetime(2026, 12, 1, 10, 0, 0, tzinfo=datetime.UTC)
SPEC = RolloutSpec(steps=[RolloutStep(weight=10, pause="60s"), RolloutStep(weight=50, pause="60s")])

# one status per phase (a rollout of revision "new" over stable "old" where there is one)
IN_ROLLOUT: dict[str, Any] = {"stable_revision": "old", "canary_revision": "new", "step": 0}
STATUSES = {
    "Idle": RolloutStatus(phase="Idle", stable_revision="new"),
    "Promoted": RolloutStatus(phase="Promoted", stable_revision="new"),
    "Progressing": RolloutStatus(phase="Progressing", stage="Analyzing", weight=10, **IN_ROLLOUT),
    "Paused": RolloutStatus(phase="Paused", stage="Analyzing", reason="ManualPause", **IN_ROLLOUT),
    "Aborted": RolloutStatus(phase="Aborted", stage="Starting", reason="ManualAbort", **IN_ROLLOUT),
}


def handled(status: RolloutStatus, action: str) -> bool:
    """Whether the machine acts on ``action`` (given as a fresh annotation) in ``status``."""
    observed = RolloutObservation(
        revision="new",
        warm_replicas=4,
        canary_ready=1,
        stable_kv=2048,
        canary_kv=2048,
        canary_unschedulable=False,
        analysis=None,
        stable_in_flight=None,
        stable_updated=False,
        action=f"{action}@1",
        now=T0,
    )
    decision = decide_rollout(SPEC, status, observed)
    return not any(e.reason == EVENT_ACTION_IGNORED for e in decision.events)


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("phase", STATUSES)
def test_the_plugin_refuses_exactly_what_the_operator_ignores(phase: str, action: str) -> None:
    acts = handled(STATUSES[phase], action)

    refusal = assess_action(action, phase)

    assert (refusal is None) == acts, f"{action} in {phase}: machine acts={acts}, {refusal=}"


def test_every_action_of_the_machine_is_in_the_table() -> None:
    assert set(ACTION_PHASES) == set(ACTIONS)


REFUSALS = {
    "abort-idle": ("abort", "Idle", "no rollout in progress (phase Idle): 'abort' would be"),
    "never-reconciled": ("promote", None, "no rollout in progress (phase Idle)"),
    "pause-paused": ("pause", "Paused", "'pause' does nothing in phase Paused (it acts in: "),
    "resume-progressing": ("resume", "Progressing", "(it acts in: Paused, Aborted)"),
}


@pytest.mark.parametrize(("action", "phase", "expected"), REFUSALS.values(), ids=REFUSALS.keys())
def test_a_refusal_names_the_phase_and_where_the_action_works(
    action: str, phase: str | None, expected: str
) -> None:
    refusal = assess_action(action, phase)

    assert refusal is not None and expected in refusal, refusal
