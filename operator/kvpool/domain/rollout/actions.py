"""The user actions of a rollout: which there are, how an annotation value names one, and
whether one would do anything, before anyone asks the operator for it.

Why it exists: a human steers a rollout through the annotation ``kvpool.dev/rollout``
(``resume``, ``abort``, ``promote``, ``pause``, optionally suffixed ``@token`` so a repeated
action is a new value); the state machine reads it with :func:`parse_action`, and the
``kubectl kvpool rollout`` plugin offers :data:`ACTIONS` as its verbs. The plugin writes
the annotation and the operator handles it on its next reconcile, so an action that does
nothing in the rollout's phase would only be *recorded* as ignored (an Event nobody is
watching). The plugin checks first with :func:`assess_action` and refuses, naming the
phase and what would work, instead of printing ``annotated`` and exiting 0.

The table is the state machine's own (:mod:`kvpool.domain.rollout.machine`, ``_act``);
``tests/unit/test_rollout_actions.py`` drives the machine through every phase and action
and fails when the two disagree.

Worked example::

    >>> assess_action("abort", "Idle")
    "no rollout in progress (phase Idle): 'abort' would be ignored"
    >>> assess_action("abort", "Paused") is None
    True
"""

from __future__ import annotations

from kvpool.domain.rollout.vocabulary import ABORTED, IDLE, PAUSED, PROGRESSING, PROMOTED

ACTIONS = ("resume", "abort", "promote", "pause")  # the values kvpool.dev/rollout may name

# action -> the phases in which the operator acts on it
ACTION_PHASES: dict[str, tuple[str, ...]] = {
    "abort": (PROGRESSING, PAUSED),
    "pause": (PROGRESSING,),
    "promote": (PROGRESSING, PAUSED),
    "resume": (PAUSED, ABORTED),
}
_NO_ROLLOUT = (IDLE, PROMOTED)


def assess_action(action: str, phase: str | None) -> str | None:
    """None when the operator acts on ``action`` in ``phase``, else why it would not.

    ``phase`` None means the operator has recorded no rollout yet (same as Idle).

    >>> assess_action("pause", "Paused")
    "'pause' does nothing in phase Paused (it acts in: Progressing)"
    """
    current = phase or IDLE
    allowed = ACTION_PHASES.get(action)
    if allowed is None:
        return f"unknown action {action!r} (actions: {', '.join(sorted(ACTION_PHASES))})"
    if current in allowed:
        return None
    if current in _NO_ROLLOUT:
        return f"no rollout in progress (phase {current}): {action!r} would be ignored"
    return f"{action!r} does nothing in phase {current} (it acts in: {', '.join(allowed)})"


def parse_action(value: str | None) -> str | None:
    """The action of an annotation value (``resume`` or ``resume@anything``), else None.

    >>> parse_action("promote@1733047200"), parse_action("bogus"), parse_action(None)
    ('promote', None, None)
    """
    if not value:
        return None
    action = value.split("@", 1)[0].strip().lower()
    return action if action in ACTIONS else None
