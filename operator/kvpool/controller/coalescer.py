"""A per-key queue that never runs one key twice at once and folds bursts into one run.

Why it exists: a pool is touched by many triggers (its own change, its policy, its
Deployment's readiness, the measurement timer, a rollout waiting for its next analysis);
a namespace config by every pool, budget, Secret and pod of it. Reconciling once per
trigger would do the same work many times and could run two reconciles of one pool
concurrently. Every trigger therefore goes through a :class:`Coalescer`: a request made
while a run for its key waits is served by that run.

Worked example: ten ``request("ns")`` calls issued while one publish of ``ns`` runs cost
one more publish (the one that starts after the first ends), not ten. A
``request_after("ns", 5)`` while another for ``ns`` is due in 2 s changes nothing; one due
in 1 s replaces it (a key has at most one delayed request, the earliest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from kvpool.adapters.background import BackgroundTasks
from kvpool.controller.clock import Clock, SystemClock


class Coalescer:
    """Runs ``fn(key)`` at most once at a time per key; requests made while a run is
    waiting are served by that run (a burst of triggers costs one or two runs)."""

    def __init__(
        self,
        fn: Callable[[Any], Awaitable[None]],
        *,
        tasks: BackgroundTasks | None = None,
        clock: Clock | None = None,
        label: str = "requeue",
    ) -> None:
        self.fn = fn
        self._tasks = tasks if tasks is not None else BackgroundTasks()
        self._clock = clock if clock is not None else SystemClock()
        self._label = label  # names the delayed requests' failures (log line, metric)
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._requested: dict[Hashable, int] = {}
        self._covered: dict[Hashable, int] = {}
        self._delayed: dict[Hashable, tuple[float, asyncio.Task[Any]]] = {}

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

    def request_after(self, key: Hashable, seconds: float) -> None:
        """Request ``key`` once ``seconds`` from now (a requeue-after). A key has at most
        one delayed request: an earlier one is kept, a later one replaced."""
        due = self._clock.monotonic() + max(seconds, 0.0)
        pending = self._delayed.get(key)
        if pending is not None:
            if pending[0] <= due:
                return
            pending[1].cancel()
        task = self._tasks.spawn(self._request_later(key, seconds), self._label)
        self._delayed[key] = (due, task)

    def delayed(self, key: Hashable) -> float | None:
        """When the delayed request of ``key`` is due (monotonic seconds), None if none."""
        pending = self._delayed.get(key)
        return pending[0] if pending is not None else None

    async def _request_later(self, key: Hashable, seconds: float) -> None:
        await self._clock.sleep(max(seconds, 0.0))
        pending = self._delayed.get(key)
        if pending is not None and pending[1] is asyncio.current_task():
            del self._delayed[key]  # from now on a new delayed request may be made
        await self.request(key)
