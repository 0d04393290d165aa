"""Measure how late the gateway's event loop wakes up: the on-call signal of a stalled loop.

Why this module exists: every request of every tenant is relayed by one event loop, so
anything that holds it (a large body parsed in place, a slow exposition parse, a long
garbage collection) delays all of them at once, and the queue-time and TTFT series show
it only as a vague tail. A task that asks to sleep ``interval`` seconds and notes how much
later it woke measures that hold directly; the histogram
``kvpool_gateway_event_loop_lag_seconds`` is what an alert or a benchmark reads.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

LAG_INTERVAL_SECONDS = 0.05  # 20 wake-ups a second: negligible cost, catches 5 ms stalls


async def watch_loop_lag(lag: Histogram, interval: float = LAG_INTERVAL_SECONDS) -> None:
    """Observe, forever, how late each ``interval`` sleep ended (0 when on time)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(interval)
        lag.observe(max(loop.time() - asked - interval, 0.0))
