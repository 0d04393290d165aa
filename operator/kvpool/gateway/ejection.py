"""Outlier ejection on the event loop: health probes, failure reports, in-flight aborts.

Why this module exists: :mod:`kvpool.domain.outlier` decides *when* a replica is out; this
class feeds it and carries the verdicts out:

- every ``probe_interval`` (0.5 s) it GETs ``/health`` of every replica the config lists
  ready, each bounded by ``probe_timeout`` (1 s). A refused connection is a ``refused``
  failure (ejects at once); no answer in time or a 5xx is a ``health`` failure, which
  ejects when the next probe fails too; any other answer is a success. So a hung engine
  that still accepts TCP connections is caught within 2 x (interval + timeout), 3 s, and
  one probe that a loaded machine answers late ejects nothing;
- the request path reports ``refused`` (connection refused) and ``timeout`` (no first
  token, or a stalled stream) failures;
- an ejection takes the replica out of routing (``PoolRuntime.set_replica_ejected``),
  counts ``kvpool_gateway_ejections_total{pool,reason}``, sets
  ``kvpool_gateway_replica_ejected{pool,replica}`` to 1, and expires the deadline of every
  request in flight on it: they end with 504 ``engine_timeout`` (or an in-band stream
  error) and release their reservations at once instead of waiting out the upstream
  timeout;
- a success after the ejection time puts it back (gauge 0);
- a replica that leaves the config (its pod deleted) is forgotten with its gauge, so an
  alert on the gauge (KvpoolReplicaEjected) never fires for a replica that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping

import aiohttp
from prometheus_client import Counter, Gauge

from kvpool.adapters.background import BackgroundTasks
from kvpool.domain.outlier import (
    Eject,
    FailureKind,
    OutlierPolicy,
    ReplicaHealth,
    Restore,
    decide_failure,
    decide_success,
)
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pool_runtime import PoolRuntime

log = logging.getLogger("kvpool.gateway")

Key = tuple[str, str]  # (pool, replica)


class ReplicaEjector:
    """Outlier ejection for every pool of one gateway process."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        runtimes: Callable[[], Mapping[str, PoolRuntime]],
        policy: OutlierPolicy | None = None,
        *,
        probe_interval: float = 0.5,
        probe_timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy or OutlierPolicy()
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self._runtimes = runtimes
        self._clock = clock
        self._states: dict[Key, ReplicaHealth] = {}
        self._in_flight: dict[Key, set[asyncio.Timeout]] = {}
        self._probes = BackgroundTasks()
        self._session: aiohttp.ClientSession | None = None
        self.ejected_gauge = Gauge(
            "kvpool_gateway_replica_ejected",
            "1 while outlier ejection keeps the replica out of routing.",
            ["pool", "replica"],
            registry=metrics.registry,
        )
        self.ejections = Counter(
            "kvpool_gateway_ejections",
            "Replicas taken out of routing, by reason: refused, timeout, health.",
            ["pool", "reason"],
            registry=metrics.registry,
        )

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the health probes (``probe_interval`` <= 0: passive ejection only), on
        their own connection pool (a probe never waits behind requests, nor they on it)."""
        if self.probe_interval > 0 and self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            self._probes.spawn(self._probe_loop(self._session), "health probes")

    async def stop(self) -> None:
        """Stop the probes and close their connection pool."""
        await self._probes.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def forget_absent(self) -> None:
        """Drop the state and the gauge of every replica no pool's config lists any more
        (and the pool's memory of its ejection: listed again, it starts in routing)."""
        runtimes = self._runtimes()
        present = {
            (runtime.pool.name, endpoint.name)
            for runtime in runtimes.values()
            for track in runtime.pool.tracks
            for endpoint in track.endpoints
        }
        for key in [k for k in self._states if k not in present]:
            state = self._states.pop(key)
            runtime = runtimes.get(key[0])
            if state.ejected and runtime is not None:
                runtime.set_replica_ejected(key[1], False)
            with contextlib.suppress(KeyError):  # a state without a gauge child
                self.ejected_gauge.remove(*key)

    # -- reports ---------------------------------------------------------------------------

    def failure(self, runtime: PoolRuntime, replica: str, kind: FailureKind) -> None:
        """A request or probe saw ``replica`` fail."""
        key = (runtime.pool.name, replica)
        state, verdict = decide_failure(
            self._states.get(key, ReplicaHealth()), kind, self._clock(), self.policy
        )
        self._states[key] = state
        if isinstance(verdict, Eject):
            log.warning(
                "replica %s of pool %s ejected for %.1fs (%s)",
                replica,
                runtime.pool.name,
                verdict.seconds,
                kind,
            )
            self.ejections.labels(runtime.pool.name, kind).inc()
            self.ejected_gauge.labels(runtime.pool.name, replica).set(1)
            runtime.set_replica_ejected(replica, True)
            now = asyncio.get_running_loop().time()
            for deadline in self._in_flight.get(key, ()):
                deadline.reschedule(now)  # they end now and release their reservations

    def success(self, runtime: PoolRuntime, replica: str) -> None:
        """A probe of ``replica`` succeeded."""
        key = (runtime.pool.name, replica)
        state, verdict = decide_success(
            self._states.get(key, ReplicaHealth()), self._clock(), self.policy
        )
        self._states[key] = state
        if isinstance(verdict, Restore):
            log.info("replica %s of pool %s back in routing", replica, runtime.pool.name)
            runtime.set_replica_ejected(replica, False)
        self.ejected_gauge.labels(runtime.pool.name, replica).set(1 if state.ejected else 0)

    @contextlib.contextmanager
    def track(self, pool: str, replica: str | None, deadline: asyncio.Timeout) -> Iterator[None]:
        """Register a request in flight on ``replica`` (its deadline expires on ejection)."""
        if replica is None:
            yield
            return
        key = (pool, replica)
        if self._states.get(key, ReplicaHealth()).ejected:
            deadline.reschedule(asyncio.get_running_loop().time())
        group = self._in_flight.setdefault(key, set())
        group.add(deadline)
        try:
            yield
        finally:
            group.discard(deadline)
            if not group:
                self._in_flight.pop(key, None)

    # -- probes ----------------------------------------------------------------------------

    async def _probe_loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            probes = [
                self._probe(session, runtime, endpoint.name, endpoint.url)
                for runtime in list(self._runtimes().values())
                for track in runtime.pool.tracks
                for endpoint in track.endpoints
                if endpoint.ready
            ]
            if probes:
                await asyncio.gather(*probes)
            await asyncio.sleep(self.probe_interval)

    async def _probe(
        self, session: aiohttp.ClientSession, runtime: PoolRuntime, name: str, url: str
    ) -> None:
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout)
        failure: FailureKind | None = None
        try:
            async with session.get(url.rstrip("/") + "/health", timeout=timeout) as resp:
                failure = "health" if resp.status >= 500 else None
        except aiohttp.ClientConnectorError:  # nothing listens: gone, not slow
            failure = "refused"
        except (aiohttp.ClientError, TimeoutError, OSError):
            failure = "health"
        if failure is None:
            self.success(runtime, name)
        else:
            self.failure(runtime, name, failure)
