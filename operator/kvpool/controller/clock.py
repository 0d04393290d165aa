"""The operator's wall clock, in the one format its statuses and Events use.

Why it exists: conditions, Events and measurements carry RFC 3339 times; every
controller module reads the time through this one function (the pure decisions in
``kvpool.domain`` never read a clock: they are handed ``now``).
"""

from __future__ import annotations

import datetime


def utc_now() -> str:
    """The current time in RFC 3339 (seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
