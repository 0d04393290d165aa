"""A per-key queue that never runs one key twice at once and folds bursts into one run.

Why it exists: a pool is touched by many triggers (its own change, its policy, its
Deployment's readiness, the measurement timer); a namespace config by every pool, budget,
Secret and pod of it. Reconciling once per trigger would do the same work many times and
could run two reconciles of one pool concurrently. Every trigger therefore goes through a
:class:`Coalescer`: a request made while a run for its key waits is served by that run.

Worked example: ten ``request("ns")`` calls issued while one publish of ``ns`` runs cost
one more publish (the one that starts after the first ends), not ten.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any


class Coalescer:
    """Runs ``fn(key)`` at most once at a time per key; requests made while a run is
    waiting are served by that run (a burst of triggers costs one or two runs)."""

    def __init__(self, fn: Callable[[Any], Awaitable[None]]) -> None:
        self.fn = fn
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._requested: dict[Hashable, int] = {}
        self._covered: dict[Hashable, int] = {}

    async def request(self, key: Hashable) -> None:
        ticket = self._requested[key] = self._requested.get(key, 0) + 1
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self._covered.get(key, 0) >= ticket:
                return  # a run that started after this request already saw its cause
            self._covered[key] = self._requested[key]
            try:
                await self.fn(key)
            except BaseException:
                self._covered[key] = ticket - 1
                raise
