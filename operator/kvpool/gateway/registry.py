"""The pools this gateway admits to: their runtimes, what they learned, their tokenizers.

Why this module exists: every pool of the config needs three things that outlive a
single request and must follow each config reload - a
:class:`~kvpool.gateway.pool_runtime.PoolRuntime` (admission on the event loop, with the
reservations in flight), a :class:`~kvpool.domain.admission.adaptation.PoolAdaptation`
(learned outputs, overcommit ratio, TTFT limiters) and its tokenizer loaded. Before, the
HTTP server created and mutated them while the request pipeline owned them; here one
object owns them and the others ask it.

- :meth:`PoolRegistry.sync`: adopt a config. A new pool gets a runtime; a pool that
  stays is reconfigured (its in-flight reservations are kept); a pool that left has its
  waiters rejected (``pool_removed``) and its learned state dropped. Returns the names of
  the pools that left, so the engine watcher and outlier ejection can forget them.
- :meth:`PoolRegistry.refresh_capacity`: re-apply this replica's share
  (:mod:`kvpool.gateway.capacity`) to one pool at any moment, without a config: the
  runtime adopts the new view and keeps its reservations. A share that moves often
  (capacity leases) calls it whenever a pool's share changed; it costs one
  ``reconfigure``, no config parse.
- :meth:`PoolRegistry.tick_lent_limits`: time passed (the engine watcher calls it every
  poll round): lent limits of protected tiers that have been idle go back to their
  maximum, with their gauges.
- :meth:`PoolRegistry.load_tokenizers`: load each pool's tokenizer when a config comes
  (not on its first request) and set ``kvpool_gateway_tokenizer_fallback{pool}`` (1 while
  the pool counts prompts by the byte estimate). A load reads and parses files (a large
  ``tokenizer.json`` takes a second, a path on a hung volume never ends), so every load
  runs on a thread of its own (:class:`~kvpool.adapters.tokenizer.TokenizerCache`) and
  nothing waits for it - not the construction, not the start-up (before, a FIFO path
  froze a restarting gateway for good), not another pool; the flags follow each load as
  it ends (in a background task once the loop runs) and a pool whose tokenizer cannot
  load is logged once; a load that ends after a newer config came is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kvpool.adapters.background import BackgroundTasks
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import AdmissionConfig, CompiledPool, CompiledTier
from kvpool.domain.admission import AdmissionSnapshot
from kvpool.domain.admission.adaptation import PoolAdaptation
from kvpool.gateway.capacity import CapacityShare
from kvpool.gateway.config_index import ConfigIndex
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pool_runtime import PoolRuntime

log = logging.getLogger("kvpool.gateway")


class PoolRegistry:
    """The runtime, adaptation and tokenizer state of every pool of the config."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        capacity: CapacityShare,
        tokenizers: TokenizerCache,
        tasks: BackgroundTasks,
        *,
        learn_reservations: bool = True,
        borrow_pause_usage: float = 0.97,
    ) -> None:
        self.metrics = metrics
        self.capacity = capacity
        self.tokenizers = tokenizers
        self.learn_reservations = learn_reservations
        self.borrow_pause_usage = borrow_pause_usage
        self.runtimes: dict[str, PoolRuntime] = {}
        self.adaptations: dict[str, PoolAdaptation] = {}  # pool -> learned/measured state
        self._plans: dict[str, tuple[CompiledPool, list[CompiledTier]]] = {}  # as compiled
        self._tasks = tasks
        self._tokenizer_generation = 0  # configs whose tokenizers were asked for

    # -- config ----------------------------------------------------------------------------

    def sync(self, index: ConfigIndex) -> list[str]:
        """Adopt ``index``'s pools (on the running loop); the names of the pools that left."""
        names = {p.name for p in index.config.pools}
        for compiled in index.config.pools:
            self._plans[compiled.name] = (compiled, index.tiers_of(compiled))
            self.refresh_capacity(compiled.name)
        removed = [name for name in self.runtimes if name not in names]
        for name in removed:
            self.runtimes.pop(name).close()
            self.adaptations.pop(name, None)
            self._plans.pop(name, None)
        return removed

    def refresh_capacity(self, name: str) -> None:
        """Apply this replica's current share of ``name``'s plan to its runtime (in-flight
        reservations are kept). Unknown pools are ignored."""
        plan = self._plans.get(name)
        if plan is None:
            return
        compiled, tiers = plan
        pool = self.capacity.pool_view(compiled, tiers)
        whole = None if pool is compiled else compiled  # a share: "too large" is the pool's
        runtime = self.runtimes.get(name)
        if runtime is None:
            self.runtimes[name] = PoolRuntime(pool, tiers, self.metrics, whole=whole)
        else:
            runtime.reconfigure(pool, tiers, whole=whole)
        self._sync_adaptation(pool, tiers)

    def _sync_adaptation(self, pool: CompiledPool, tiers: list[CompiledTier]) -> None:
        adaptation = self.adaptations.get(pool.name)
        before = set() if adaptation is None else {t.name for t in adaptation.tiers}
        if adaptation is None:
            adaptation = self.adaptations[pool.name] = PoolAdaptation(
                tiers,
                pool.total_slots,
                learn=self.learn_reservations,
                pause_usage=self.borrow_pause_usage,
            )
        else:
            adaptation.configure(tiers, pool.total_slots)
        for tier in tiers:
            self.metrics.overcommit_ratio.labels(pool.name, tier.name).set(
                adaptation.ratio_of(tier.name)
            )
        for name in before | {t.name for t in tiers}:
            self._limiter_gauges(pool.name, name)

    def _limiter_gauges(self, pool: str, tier: str) -> None:
        """The TTFT limiter's gauges of a tier as its limiter is now; none without one (a
        target removed by a reload leaves no stale series)."""
        adaptation = self.adaptations.get(pool)
        limiter = adaptation.limiters.get(tier) if adaptation is not None else None
        gauges = (self.metrics.ttft_target, self.metrics.lent_limit, self.metrics.ttft_p95)
        values = (limiter.target_seconds, limiter.limit, limiter.p95) if limiter else (None,) * 3
        for gauge, value in zip(gauges, values, strict=True):
            if value is None:
                with contextlib.suppress(KeyError):  # never set
                    gauge.remove(pool, tier)
            else:
                gauge.labels(pool, tier).set(value)

    def tick_lent_limits(self, name: str) -> None:
        """Time passed (every engine poll round): the lent limits of idle protected tiers
        of pool ``name`` go back to their maximum (``PoolAdaptation.tick``)."""
        runtime, adaptation = self.runtimes.get(name), self.adaptations.get(name)
        if runtime is None or adaptation is None:
            return
        for tier, limit in adaptation.tick(runtime.now()).items():
            runtime.set_lent_limit(tier, limit)
            self._limiter_gauges(name, tier)

    def track_snapshots(self) -> list[tuple[str, AdmissionSnapshot]]:
        """Every pool's per-track in-use vs plan views (for the scrape-time gauges)."""
        return [s for runtime in self.runtimes.values() for s in runtime.track_snapshots()]

    def close(self) -> None:
        """Reject whoever still waits in any pool (shutdown)."""
        for runtime in self.runtimes.values():
            runtime.close()

    # -- tokenizers ------------------------------------------------------------------------

    def load_tokenizers(self, config: AdmissionConfig) -> None:
        """Start loading every pool's tokenizer (each on its own thread), flag the pools
        that count by the byte estimate now, and - once the loop runs - again as the loads
        end. Never waits for a load."""
        self._tokenizer_generation += 1
        paths = {pool.name: pool.tokenizer_path for pool in config.pools}
        loaded = {pool: self.tokenizers.peek(path) is not None for pool, path in paths.items()}
        self._flag_tokenizers(self._tokenizer_generation, loaded, paths, final=False)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # constructing, before the loop: Gateway.start() calls again
            return
        self._tasks.spawn(self._follow_loads(self._tokenizer_generation, paths), "tokenizer load")

    async def _follow_loads(self, generation: int, paths: dict[str, str | None]) -> None:
        wait = self.tokenizers.load_seconds + 1.0  # a load is abandoned by then
        results = await asyncio.gather(
            *(self.tokenizers.loaded(path, wait) for path in paths.values())
        )
        loaded = {pool: r is not None for pool, r in zip(paths, results, strict=True)}
        self._flag_tokenizers(generation, loaded, paths, final=True)

    def _flag_tokenizers(
        self,
        generation: int,
        loaded: dict[str, bool],
        paths: dict[str, str | None],
        *,
        final: bool,
    ) -> None:
        """Set ``tokenizer_fallback`` per pool, unless a newer config came meanwhile."""
        if generation != self._tokenizer_generation:
            return
        self.metrics.tokenizer_fallback.clear()
        for pool, ok in loaded.items():
            self.metrics.tokenizer_fallback.labels(pool).set(0 if ok else 1)
            if final and not ok and paths[pool]:
                log.warning(
                    "pool %s: its tokenizer %s did not load; its prompts are counted by the "
                    "byte estimate (kvpool_gateway_tokenizer_fallback=1)",
                    pool,
                    paths[pool],
                )
