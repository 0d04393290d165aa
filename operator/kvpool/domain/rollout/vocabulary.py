"""The rollout's vocabulary: the names of its phases and stages, the reasons it pauses or
aborts for, and the reasons of the Events it posts.

Why it exists: these names are an interface, not an implementation detail. They are
written to ``status.rollout`` (``phase``, ``stage``, ``reason``) and to Events, and read
back by the operator (:mod:`kvpool.controller.rollout`), the ``kubectl kvpool rollout``
plugin and whoever watches. One module names them once, below every module that uses
them, so the state machine (:mod:`kvpool.domain.rollout.machine`) and its readers agree.

The gate reasons (``KVCapacityShrunk``, ``TTFTRegressed``, ...) belong to the gates and
live in :mod:`kvpool.domain.rollout.gates`; the user actions in
:mod:`kvpool.domain.rollout.actions`.
"""

from __future__ import annotations

from typing import Final

from kvpool.api.rollout import RolloutPhase, RolloutStage

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

# reasons (status.rollout.reason) the machine sets itself, beside the gates' own
CANARY_UNSCHEDULABLE = "CanaryUnschedulable"
MANUAL_PAUSE = "ManualPause"
MANUAL_ABORT = "ManualAbort"
MANUAL_PROMOTE = "ManualPromote"

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
