"""The event-loop lag watcher reports a stalled loop, and nothing when the loop is free."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Histogram

from kvpool.gateway.loop_lag import watch_loop_lag
from tests.support.timing import stall_loop
from tests.support.waiting import wait_until_async


def lag_histogram() -> tuple[Histogram, CollectorRegistry]:
    registry = CollectorRegistry()
    return Histogram("lag_seconds", "test", buckets=(0.005, 0.05, 1.0), registry=registry), registry


def sample(registry: CollectorRegistry, name: str, le: str | None = None) -> float:
    labels = {"le": le} if le else {}
    return registry.get_sample_value(name, labels) or 0.0


def observed(registry: CollectorRegistry) -> float:
    return sample(registry, "lag_seconds_count")


async def test_a_blocked_loop_is_reported_as_lag() -> None:
    lag, registry = lag_histogram()
    watcher = asyncio.create_task(watch_loop_lag(lag, interval=0.01))
    await wait_until_async(lambda: observed(registry) >= 1, 5, "the watcher running")
    before = observed(registry)
    stall_loop(0.08)  # the stall under test: what a large body parsed on the loop does to all
    await wait_until_async(lambda: observed(registry) > before, 5, "the wake-up after it")
    watcher.cancel()
    # one wake-up came at least 60 ms late (asked 10 ms, blocked 80 ms)
    assert sample(registry, "lag_seconds_bucket", "0.05") < sample(registry, "lag_seconds_count")
    assert sample(registry, "lag_seconds_sum") >= 0.06


async def test_the_watcher_observes_every_interval() -> None:
    lag, registry = lag_histogram()
    watcher = asyncio.create_task(watch_loop_lag(lag, interval=0.01))
    await wait_until_async(lambda: observed(registry) >= 3, 5, "three intervals observed")
    watcher.cancel()
    assert sample(registry, "lag_seconds_bucket", "1.0") == sample(registry, "lag_seconds_count")
