"""Watch what the engines themselves report, and correct admission with it.

Why this module exists: the admission ledger counts *reservations*; only an engine knows
what its KV cache really holds and whether it preempted. This watcher polls every ready
replica's ``/metrics`` (:func:`kvpool.adapters.engine_metrics.fetch_engine_load`) and,
per pool:

- counts the preemptions since the last poll (``vllm:num_preemptions_total`` is
  cumulative per replica, so the watcher remembers each replica's last total) into
  ``kvpool_gateway_engine_preemptions_total{pool}``, and hands them with the highest KV
  usage to the pool's adaptation (:meth:`PoolAdaptation.engines`), which backs the
  overcommit ratio off and decides whether borrowing pauses;
- pauses or resumes borrowing on the pool's runtime (``kvpool_gateway_borrowing_paused``);
- every round, whether the engines answer or not, lets the registry give back the lent
  limits of protected tiers that have been idle (:meth:`PoolRegistry.tick_lent_limits`);
- keeps ``kvpool_gateway_engine_kv_usage{pool,replica}`` for the replicas it polls, and
  drops the gauge of a replica no longer polled (gone, or not ready).

A poll that no engine of a pool answers keeps the last view (counted in
``kvpool_gateway_engine_poll_errors_total``). The period is this replica's share of the
engines' poll budget (:meth:`CapacityShare.poll_period`: each of N gateway replicas polls
every N x ``--engine-poll-seconds``), read again before every poll, from a random phase so
that replicas started together do not poll in step. Each poll tells the adaptation how
many of those periods it covers, so that the overcommit ratio creeps with time as one
replica's would (:meth:`OvercommitRatio.observe_poll`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable

from kvpool.adapters.engine_metrics import EngineLoad
from kvpool.gateway.capacity import CapacityShare
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.registry import PoolRegistry

log = logging.getLogger("kvpool.gateway")

FetchLoad = Callable[[str], Awaitable[EngineLoad | None]]  # replica URL -> its load or None


class EngineWatcher:
    """Polls the engines of every pool of a registry."""

    def __init__(
        self,
        registry: PoolRegistry,
        metrics: GatewayMetrics,
        capacity: CapacityShare,
        fetch: FetchLoad,
        poll_seconds: float,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.capacity = capacity
        self.poll_seconds = poll_seconds
        self._fetch = fetch
        # pool -> replica URL -> its last preemption total; pruned with the replica (a
        # replica that leaves the config) and the pool
        self._preemptions_seen: dict[str, dict[str, int]] = {}
        self._kv_usage_series: dict[str, set[str]] = {}  # pool -> replicas with a usage gauge

    async def run(self) -> None:
        """Poll every pool, forever (one failed poll never ends the watch)."""
        await asyncio.sleep(random.uniform(0, self.capacity.poll_period(self.poll_seconds)))
        while True:
            await asyncio.sleep(self.capacity.poll_period(self.poll_seconds))
            for name in list(self.registry.runtimes):
                try:
                    self.registry.tick_lent_limits(name)  # answered or not: time passed
                    await self.poll_pool(name)
                except Exception as exc:  # one bad poll must not end the watch
                    log.warning("engine poll of pool %s failed: %s", name, exc)

    def periods_per_poll(self) -> float:
        """The poll periods of all replicas together that one poll of this replica covers
        (N of N live replicas): the overcommit ratio creeps by time, not by poll."""
        if self.poll_seconds <= 0:
            return 1.0
        return self.capacity.poll_period(self.poll_seconds) / self.poll_seconds

    def forget_pool(self, pool: str) -> None:
        """The pool left the config: drop its usage gauges and preemption counts."""
        self._forget_kv_usage(pool, set())
        self._preemptions_seen.pop(pool, None)

    def _forget_kv_usage(self, pool: str, polled: set[str]) -> None:
        """Drop the usage gauges of replicas no longer polled (gone, or not ready)."""
        for replica in self._kv_usage_series.get(pool, set()) - polled:
            with contextlib.suppress(KeyError):  # never set: its polls all failed
                self.metrics.engine_kv_usage.remove(pool, replica)
        if polled:
            self._kv_usage_series[pool] = polled
        else:
            self._kv_usage_series.pop(pool, None)

    async def poll_pool(self, name: str) -> None:
        """Poll the ready replicas of one pool and apply what they report."""
        runtime = self.registry.runtimes.get(name)
        adaptation = self.registry.adaptations.get(name)
        if runtime is None or adaptation is None:
            return
        listed = {e.url for track in runtime.pool.tracks for e in track.endpoints}
        seen = self._preemptions_seen.setdefault(name, {})
        for url in set(seen) - listed:  # the replica left the config
            del seen[url]
        endpoints = [e for track in runtime.pool.tracks for e in track.endpoints if e.ready]
        self._forget_kv_usage(name, {e.name for e in endpoints})
        if not endpoints:
            return
        loads = await asyncio.gather(*(self._fetch(e.url) for e in endpoints))
        new, usage = 0, None
        for endpoint, load in zip(endpoints, loads, strict=True):
            if load is None:
                self.metrics.engine_poll_errors.labels(name).inc()
                continue
            before = seen.get(endpoint.url)
            seen[endpoint.url] = load.preemptions_total
            if before is not None and load.preemptions_total > before:
                new += load.preemptions_total - before
            usage = load.kv_usage if usage is None else max(usage, load.kv_usage)
            self.metrics.engine_kv_usage.labels(name, endpoint.name).set(load.kv_usage)
        if usage is None:
            return  # no engine answered: keep the last view (counted in poll errors)
        if new:
            self.metrics.engine_preemptions.labels(name).inc(new)
        verdict = adaptation.engines(new, usage, self.periods_per_poll())
        runtime.set_borrowing_paused(verdict.pause_borrowing)
        self.metrics.borrowing_paused.labels(name).set(1 if verdict.pause_borrowing else 0)
        for tier in adaptation.tiers:
            self.metrics.overcommit_ratio.labels(name, tier.name).set(
                adaptation.ratio_of(tier.name)
            )
