"""The operator's clocks: the wall clock its statuses and Events carry, a monotonic clock
for local deadlines, and sleeping - behind one :class:`Clock` a test can replace.

Why it exists: conditions, Events and measurements carry RFC 3339 wall-clock times, but a
deadline this process keeps for itself (a requeue-after, the leader's renew deadline)
must not move when the wall clock is stepped (NTP, a VM resumed). Every controller module
reads time through the :class:`Clock` in :class:`~kvpool.controller.state.OperatorState`
(the pure decisions in ``kvpool.domain`` never read a clock: they are handed ``now``).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Protocol


class Clock(Protocol):
    """Where the operator reads the time and waits."""

    def wall(self) -> float:
        """Seconds since the epoch (for times written to the API; may be stepped)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for this process's own deadlines)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (on the monotonic clock)."""
        ...


class SystemClock:
    """The host's clocks: ``time.time``, ``time.monotonic``, ``asyncio.sleep``."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def utc(clock: Clock) -> datetime.datetime:
    """The clock's wall time as an aware UTC datetime."""
    return datetime.datetime.fromtimestamp(clock.wall(), datetime.UTC)


def rfc3339(clock: Clock) -> str:
    """The clock's wall time in RFC 3339 (seconds, UTC), the format of status and Events.

    >>> class At:
    ...     def wall(self): return 1767225600.7
    >>> rfc3339(At())  # type: ignore[arg-type]
    '2026-01-01T00:00:00Z'
    """
    return utc(clock).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(clock: Clock) -> str:
    """The clock's wall time in RFC 3339 with milliseconds (UTC): the ``generatedAt`` of a
    published admission config, fine enough that two publishes never share one (a reader
    comparing it with the gateway's ``config_info`` tells a reload from an older config).

    >>> class At:
    ...     def wall(self): return 1767225600.7
    >>> rfc3339_ms(At())  # type: ignore[arg-type]
    '2026-01-01T00:00:00.700Z'
    """
    return utc(clock).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
