"""Waiting in tests without sleeping a guessed time, and time a test moves by hand.

Why it exists: a fixed ``sleep`` is slow when it is long enough and flaky when it is not.
There are two cases, and one tool for each:

- The code under test reads a clock (budget windows, circuit breakers, leases, ejection
  timers): hand it a :class:`ManualClock` and :meth:`~ManualClock.advance` it; nothing waits.
- The test waits for something another process or task does (an engine, the operator, a
  gateway process, a background settlement): poll for the evidence with :func:`wait_until`
  (blocking) or :func:`wait_until_async` (in a coroutine; the predicate may be async). On
  timeout they fail with what was awaited, the last value and the last error.

A predicate raising :class:`StopWaitingError` (e.g. "the process I wait on has exited")
ends the wait at once; any other exception counts as "not yet" (an object not created yet,
a connection refused) and is reported if the wait times out.

>>> clock = ManualClock()
>>> clock.advance(1.5)
1001.5
>>> wait_until(lambda: clock() > 1001, what="the clock moved")
True
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tests.support.timing import loop_turns

T = TypeVar("T")


class StopWaitingError(Exception):
    """Raised by a predicate: what it waits for can no longer happen; stop waiting."""


class WaitTimeoutError(AssertionError):
    """The awaited condition did not hold in time (an assertion failure of the test)."""


class ManualClock:
    """A clock that moves only when told to: pass it where code takes ``clock``/``now``.

    Calling it returns the current time (seconds; any epoch: monotonic or wall clock). It
    is also a :class:`kvpool.controller.clock.Clock`: ``wall()`` and ``monotonic()`` read
    the same time, and ``await sleep(s)`` returns once :meth:`advance` has moved the time
    ``s`` on. :meth:`step_wall` moves the wall clock alone (NTP stepping it back); calling
    the clock then reads the wall clock, as code handed ``time.time`` would."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.wall_offset = 0.0  # wall() - monotonic(), changed by step_wall
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.wall()

    def wall(self) -> float:
        return self.now + self.wall_offset

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:  # as asyncio's: one turn of the loop
            await loop_turns()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, waiter))
        await waiter

    def sleeping(self) -> list[float]:
        """When each pending ``sleep`` ends (monotonic seconds), soonest first."""
        return sorted(due for due, waiter in self._sleepers if not waiter.done())

    def advance(self, seconds: float) -> float:
        """Move the time forward by ``seconds`` (waking the sleeps that end by then);
        return the new time."""
        self.now += seconds
        due = [(at, w) for at, w in self._sleepers if at <= self.now]
        self._sleepers = [(at, w) for at, w in self._sleepers if at > self.now]
        for _, waiter in due:
            if not waiter.done():
                waiter.set_result(None)
        return self.now

    def step_wall(self, seconds: float) -> float:
        """Step the wall clock alone by ``seconds`` (negative: back); return the wall time."""
        self.wall_offset += seconds
        return self.wall()


def describe(predicate: Callable[..., object]) -> str:
    """What a predicate checks, for a failure message: a lambda's source, else its name."""
    name = getattr(predicate, "__qualname__", repr(predicate))
    if name.endswith("<lambda>"):
        try:
            source = " ".join(inspect.getsource(predicate).split())
        except (OSError, TypeError):
            return name
        return source if len(source) <= 200 else source[:197] + "..."
    return name


def _timed_out(
    what: str | None, predicate: Callable[..., object], timeout: float, last: object, error: object
) -> WaitTimeoutError:
    return WaitTimeoutError(
        f"timed out after {timeout:g} s waiting for {what or describe(predicate)}; "
        f"last value {last!r}; last error {error!r}"
    )


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 15.0,
    what: str | None = None,
    *,
    interval: float = 0.1,
) -> T:
    """The first truthy result of ``predicate()`` within ``timeout`` seconds (blocking)."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
            last, error = result, None
        except StopWaitingError:
            raise
        except Exception as exc:  # not yet: a missing object, a refused connection...
            error = exc
        if time.monotonic() >= deadline:
            raise _timed_out(what, predicate, timeout, last, error)
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 15.0,
    what: str | None = None,
    *,
    interval: float = 0.05,
) -> T:
    """The first truthy result of ``predicate()`` (awaited when it returns an awaitable)
    within ``timeout`` seconds, polling without blocking the event loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            last, error = result, None
        except StopWaitingError:
            raise
        except Exception as exc:  # not yet
            error = exc
        if loop.time() >= deadline:
            raise _timed_out(what, predicate, timeout, last, error)
        await asyncio.sleep(interval)
