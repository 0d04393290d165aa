"""The rollout's part of a ModelPool's status: ``status.rollout``, the canary replica
count and the ``Progressing`` condition.

Why it exists: the pool's status is built by :mod:`kvpool.domain.pool_status` from the
capacity plan; the rollout adds its own record and one condition, decided here without
I/O so the pool reconciler only hands the pieces over.

``Progressing``: ``True`` with reason ``Rollout<Stage>`` (``RolloutStarting``,
``RolloutAnalyzing``, ``RolloutPromoting``, ``RolloutDraining``,
``RolloutReplacingStable``) while a rollout progresses; ``False`` with the pause reason
(``KVCapacityShrunk``, ``TTFTRegressed``, ...) when paused, ``RolloutAborted``,
``RolloutPromoted``, or ``NoRollout``.

>>> from kvpool.api.modelpool import RolloutStatus
>>> build_progressing(RolloutStatus(phase="Paused", reason="KVCapacityShrunk", message="m"))
('False', 'KVCapacityShrunk', 'm')
"""

from __future__ import annotations

from kvpool.api.common import ConditionStatus
from kvpool.api.modelpool import ModelPoolStatus, ReplicaStatus
from kvpool.api.rollout import RolloutStatus
from kvpool.domain import conditions as c


def build_progressing(rollout: RolloutStatus) -> tuple[ConditionStatus, str, str]:
    """(status, reason, message) of the ``Progressing`` condition."""
    message = rollout.message or ""
    if rollout.phase == "Progressing":
        return "True", f"Rollout{rollout.stage or 'Progressing'}", message
    if rollout.phase == "Paused":
        return "False", rollout.reason or "Paused", message
    if rollout.phase == "Aborted":
        return "False", c.ROLLOUT_ABORTED, message
    if rollout.phase == "Promoted":
        return "False", c.ROLLOUT_PROMOTED, message
    return "False", c.NO_ROLLOUT, message


def build_rollout_status(
    status: ModelPoolStatus,
    rollout: RolloutStatus,
    canary_ready: int,
    generation: int | None,
    now: str,
) -> ModelPoolStatus:
    """``status`` with ``rollout``, ``replicas.canary`` and the ``Progressing`` condition."""
    cond_status, reason, message = build_progressing(rollout)
    conds = c.set_condition(
        status.conditions, c.PROGRESSING, cond_status, reason, message, generation, now
    )
    replicas = (status.replicas or ReplicaStatus()).model_copy(update={"canary": canary_ready})
    return status.model_copy(update={"rollout": rollout, "replicas": replicas, "conditions": conds})
