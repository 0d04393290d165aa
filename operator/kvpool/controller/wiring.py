"""The composition root of the operator: the work queues, what each runs, and what follows.

Why it exists: the work modules (:mod:`.pool`, :mod:`.publisher`, :mod:`.side_statuses`,
:mod:`.watches`) know nothing of each other's queues; each returns (or calls back) what
should follow, and this module - the one place that imports them all - wires the
coalescing queues (:mod:`.coalescer`) to the functions they run:

    pools          (namespace, name) -> reconcile_pool      then: publish the namespace;
                                                            a rollout's recheck -> request_after
    publisher      namespace         -> publish_namespace   then: side statuses (background)
    side_statuses  namespace         -> apply_side_statuses TierPolicy/TenantBudget status

With leader election (:mod:`.leader`) the queues run their work only while this replica
leads; the cache is kept current either way. Background work (watches, the elector,
rechecks, side statuses) runs through the state's one
:class:`~kvpool.adapters.background.BackgroundTasks`, so a failure is logged and counted
under its label (``kvpool_operator_errors_total{stage}``) and shutdown cancels all of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kvpool.controller.cache import fill_cache
from kvpool.controller.coalescer import Coalescer
from kvpool.controller.leader import LeaderElector
from kvpool.controller.pool import cleanup_pool, reconcile_pool
from kvpool.controller.publisher import publish_namespace
from kvpool.controller.side_statuses import apply_side_statuses
from kvpool.controller.state import OperatorState, PoolKey
from kvpool.controller.watches import build_watches

log = logging.getLogger(__name__)


@dataclass
class Operator:
    """The shared state, the three queues wired to their work, and the leader elector."""

    state: OperatorState
    leader: LeaderElector | None = None  # None: no leader election (always acting)
    pools: Coalescer = field(init=False)
    publisher: Coalescer = field(init=False)
    side_statuses: Coalescer = field(init=False)

    def __post_init__(self) -> None:
        tasks, clock = self.state.tasks, self.state.clock
        self.pools = Coalescer(self._reconcile, tasks=tasks, clock=clock, label="requeue")
        self.publisher = Coalescer(self._publish, tasks=tasks, clock=clock, label="requeue")
        self.side_statuses = Coalescer(
            self._side_statuses, tasks=tasks, clock=clock, label="requeue"
        )

    @property
    def leading(self) -> bool:
        """Whether this replica may act (it holds the Lease, or there is no election)."""
        return self.leader is None or self.leader.leading

    async def _reconcile(self, key: PoolKey) -> None:
        if not self.leading:
            return
        outcome = await reconcile_pool(self.state, *key)
        if outcome.recheck_after is not None:
            self.pools.request_after(key, outcome.recheck_after)
        if outcome.exists:
            await self.publisher.request(key[0])

    async def _publish(self, namespace: str) -> None:
        if not self.leading:
            return
        await publish_namespace(self.state, namespace)
        # policy and budget statuses follow in the background: thousands of tenants must
        # not delay the next config publication
        self.state.tasks.spawn(self.side_statuses.request(namespace), "status")

    async def _side_statuses(self, namespace: str) -> None:
        if self.leading:
            await apply_side_statuses(self.state, namespace)

    def request_publish(self, namespace: str) -> None:
        """Publish a namespace soon, in the background (a watch event asks for it)."""
        self.state.tasks.spawn(self.publisher.request(namespace), "watch")

    async def pool_deleted(self, namespace: str, name: str) -> None:
        """A ModelPool is gone: remove its children (when leading), publish without it."""
        if self.leading:
            await cleanup_pool(self.state, namespace, name)
        await self.publisher.request(namespace)

    async def start(self) -> None:
        """Fill the cache (one list per kind), prime the Secret and Pod watches, then follow
        them and start the leader election in the background. Before any handler acts."""
        state, config = self.state, self.state.config
        await fill_cache(state.cache, state.kube, config.namespaces)
        for namespace in config.namespaces or (None,):
            for watch in build_watches(state.cache, state.kube, self.request_publish, namespace):
                await watch.prime()
                state.tasks.spawn(watch.follow(), "watch")
        if not config.leader_election:
            state.metrics.leader.set(1)
            return
        self.leader = LeaderElector(
            client=state.kube,
            namespace=config.lease_namespace,
            name=config.lease_name,
            identity=config.identity,
            duration=config.lease_duration,
            clock=state.clock,
            on_started=self._started_leading,
            on_stopped=lambda: state.metrics.leader.set(0),
        )
        state.tasks.spawn(self.leader.run(), "leader-election")

    async def _started_leading(self) -> None:
        self.state.metrics.leader.set(1)
        self.resync()

    def resync(self) -> None:
        """Reconcile every known pool and publish every known namespace (on becoming the
        leader: a standby saw every change but acted on none)."""
        cache, spawn = self.state.cache, self.state.tasks.spawn
        for namespace, pools in list(cache.pools.items()):
            for name in list(pools):
                spawn(self.pools.request((namespace, name)), "resync")
        for namespace in sorted({*cache.pools, *cache.policies, *cache.budgets}):
            spawn(self.publisher.request(namespace), "resync")

    async def stop(self) -> None:
        """Release the Lease, cancel every background task, close the API client."""
        if self.leader is not None:
            await self.leader.release()
        await self.state.tasks.cancel()
        await self.state.kube.close()
