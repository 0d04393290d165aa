"""Time in a rollout's status: RFC 3339 stamps, seconds since one, and when the next
analysis is due.

Why it exists: ``status.rollout`` is the rollout's only state, so every moment the state
machine needs later (when the rollout started, a step began, the last analysis ran, a
drain began) is written there as an RFC 3339 string with second precision, the form
Kubernetes uses for its own times. The machine (:mod:`kvpool.domain.rollout.machine`) and
the operator (:mod:`kvpool.controller.rollout`, which reconciles when the next analysis
is due) read them back through these helpers, so both agree on the format and on what an
absent stamp means. Nothing here reads a clock: ``now`` is passed in.

>>> stamp = to_rfc3339(datetime.datetime(2026, 1, 1, 1, 0, tzinfo=datetime.UTC))
>>> stamp, parse_rfc3339(stamp) == datetime.datetime(2026, 1, 1, 1, 0, tzinfo=datetime.UTC)
('2026-01-01T01:00:00Z', True)
>>> seconds_since(stamp, datetime.datetime(2026, 1, 1, 1, 1, tzinfo=datetime.UTC))
60.0
"""

from __future__ import annotations

import datetime

from kvpool.api.common import parse_duration
from kvpool.api.rollout import RolloutSpec, RolloutStatus
from kvpool.domain.rollout.vocabulary import ANALYZING, PROGRESSING


def to_rfc3339(moment: datetime.datetime) -> str:
    """``moment`` as a status stamp: UTC, whole seconds, ``Z``."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> datetime.datetime | None:
    """The moment of a status stamp (None for an absent or empty one)."""
    if not text:
        return None
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def seconds_since(since: str | None, now: datetime.datetime) -> float | None:
    """Seconds from the stamp ``since`` to ``now`` (None: no stamp)."""
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
    since = seconds_since(status.last_analysis_at or status.step_started_at, now)
    if since is None:
        return 0.0
    return max(0.0, parse_duration(spec.analysis_interval) - since)
