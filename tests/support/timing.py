"""Time a test spends on purpose: a stalled event loop, and turns of the loop.

Why it exists: a test that sleeps to wait for something guesses how long that takes
(poll for the evidence with :mod:`tests.support.waiting` instead). The few sleeps left in
tests are not guesses but the behaviour under test, and a name says so where a bare
``sleep`` would not:

- :func:`stall_loop` blocks this thread, its event loop with it, for a set time: what a
  large body parsed in place or a long GC pause does to every task of the process. The
  loop-lag watcher must report it, a Redis timeout must not mistake it for a slow Redis.
- :func:`loop_turns` lets the tasks that are ready now take that many steps; no time
  passes (a sleep of 0 s), so it orders the steps of tasks and waits for nothing.
"""

from __future__ import annotations

import asyncio
import time


def stall_loop(seconds: float) -> None:
    """Block the calling thread (and the event loop it runs) for ``seconds``: the stall a
    test inflicts on purpose, not a wait for anything."""
    time.sleep(seconds)


async def loop_turns(turns: int = 1) -> None:
    """Yield to the event loop ``turns`` times: each ready task runs one step per turn."""
    for _ in range(turns):
        await asyncio.sleep(0)
