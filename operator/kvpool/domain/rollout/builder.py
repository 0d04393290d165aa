"""The builder one rollout decision is written into: the next status and the Events.

Why it exists: a decision of the state machine is made in several steps (a user action,
then the stage's own step; :mod:`kvpool.domain.rollout.machine` and
:mod:`kvpool.domain.rollout.stages`), each of which may change ``status.rollout`` and post
Events. They all write through one :class:`DecisionBuilder`, so a change of phase always
stamps ``lastTransitionTime`` and posts its Event by the same rule: a Warning when the
rollout pauses or aborts on its own (a gate, a timeout), Normal otherwise (a pause or an
abort by hand included).
"""

from __future__ import annotations

import datetime
from typing import Literal

from kvpool.api.rollout import RolloutStatus
from kvpool.domain.rollout.model import RolloutEvent
from kvpool.domain.rollout.timing import to_rfc3339
from kvpool.domain.rollout.vocabulary import ABORTED, MANUAL_ABORT, MANUAL_PAUSE, PAUSED


class DecisionBuilder:
    """Accumulates the new status and events of one decision."""

    def __init__(self, status: RolloutStatus, now: datetime.datetime) -> None:
        self.status = status
        self.now = now
        self.stamp = to_rfc3339(now)
        self.events: list[RolloutEvent] = []

    def update(self, **fields: object) -> None:
        """Change fields of the status (``RolloutStatus`` field names)."""
        self.status = self.status.model_copy(update=fields)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        """Post an Event with this decision."""
        self.events.append(RolloutEvent(type_, reason, message))

    def phase(
        self, phase: str, reason: str | None, message: str, event: str, **fields: object
    ) -> None:
        """Move to ``phase`` (with ``reason`` and ``message``, and other ``fields``): stamps
        ``lastTransitionTime`` and posts the Event ``event``."""
        self.update(
            phase=phase,
            reason=reason,
            message=message,
            last_transition_time=self.stamp,
            **fields,
        )
        warning = phase in (PAUSED, ABORTED) and reason not in (MANUAL_PAUSE, MANUAL_ABORT)
        self.event("Warning" if warning else "Normal", event, message)
