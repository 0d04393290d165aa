"""What the rollout's child objects must look like: the canary Deployment's revision and
replicas, its weight in the admission config, and whether stable is pinned.

Why it exists: the operator applies children on every reconcile, including the first one
after a restart, so what they look like must follow from ``status.rollout`` alone, never
from what the last reconcile did (:func:`actions_of`). The state machine
(:mod:`kvpool.domain.rollout.machine`) records the canary replica count of each step in
that status (:func:`canary_replicas_for`), and the operator
(:mod:`kvpool.controller.rollout`) turns :class:`~kvpool.domain.rollout.model.RolloutActions`
into Deployments and config.

Worked example (stable 4 warm replicas): a rollout at step weight 10% runs 1 canary
replica with weight 10; promoting, the canary runs 4 with weight 100 for every tier and
stable keeps its template; aborted, the canary is scaled to 0 and stable is pinned.

>>> step = RolloutStatus(phase="Progressing", stage="Analyzing", canary_revision="b",
...                      weight=10, canary_replicas=1)
>>> actions_of(RolloutSpec(), step, 4)
RolloutActions(canary_revision='b', canary_replicas=1, weight=10, all_tiers=False, pin_stable=True)
"""

from __future__ import annotations

import math

from kvpool.api.rollout import RolloutSpec, RolloutStatus
from kvpool.domain.rollout.model import RolloutActions
from kvpool.domain.rollout.vocabulary import (
    ABORTED,
    DRAINING,
    DRAINING_CANARY,
    IDLE,
    PROGRESSING,
    PROMOTED,
    PROMOTING,
    REPLACING,
)


def canary_replicas_for(spec: RolloutSpec, warm: int, weight: int) -> int:
    """A step's weight of the stable warm replicas, at least 1, at most maxSurge.

    >>> canary_replicas_for(RolloutSpec(), 4, 10), canary_replicas_for(RolloutSpec(), 4, 50)
    (1, 2)
    >>> canary_replicas_for(RolloutSpec(max_surge=1), 10, 50)
    1
    """
    replicas = max(1, math.ceil(warm * weight / 100))
    return min(replicas, spec.max_surge) if spec.max_surge is not None else replicas


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
