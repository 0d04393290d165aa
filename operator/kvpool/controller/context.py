"""The state one operator process shares between its handlers, and its three work queues.

Why it exists: the handlers (:mod:`.handlers`), the pool reconciler (:mod:`.pool`), the
config publisher (:mod:`.publisher`) and the side statuses (:mod:`.side_statuses`) work
on the same clients, cache, metrics and last-written statuses. :class:`Operator` holds
them and wires the coalescing queues (:mod:`.coalescer`) to the functions they run:

    pools          (namespace, name) -> reconcile_pool     observe, plan, apply, status
    publisher      namespace         -> publish_namespace  compile and write the config
    side_statuses  namespace         -> apply_side_statuses TierPolicy/TenantBudget status

The work modules only name :class:`Operator` in annotations, so they import nothing from
here at run time (no import cycle). With leader election (:mod:`.leader`) the queues run
their work only while this replica leads; the cache is kept current either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kvpool.adapters import kube
from kvpool.adapters.prometheus import SnapshotCache
from kvpool.api.admission_config import AdmissionConfig
from kvpool.api.modelpool import ModelPoolStatus
from kvpool.controller.cache import Cache
from kvpool.controller.coalescer import Coalescer
from kvpool.controller.config import OperatorConfig
from kvpool.controller.leader import LeaderElector
from kvpool.controller.metrics import OperatorMetrics
from kvpool.controller.pool import reconcile_pool
from kvpool.controller.publisher import publish_namespace
from kvpool.controller.side_statuses import apply_side_statuses

log = logging.getLogger(__name__)


@dataclass
class Operator:
    """Everything the handlers share: clients, cache, metrics, last statuses."""

    config: OperatorConfig
    kube: kube.KubeClient
    snapshots: SnapshotCache
    metrics: OperatorMetrics
    cache: Cache = field(default_factory=Cache)
    statuses: dict[tuple[str, str], ModelPoolStatus] = field(default_factory=dict)
    written: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    published: dict[str, AdmissionConfig | None] = field(default_factory=dict)  # last config
    warned: set[tuple[str, str, str]] = field(default_factory=set)  # one-time log lines
    pools: Coalescer = field(init=False)
    publisher: Coalescer = field(init=False)
    side_statuses: Coalescer = field(init=False)
    background: set[asyncio.Task[None]] = field(default_factory=set)

    leader: LeaderElector | None = None  # None: no leader election (always acting)

    def __post_init__(self) -> None:
        self.pools = Coalescer(lambda key: self._if_leading(reconcile_pool, *key))
        self.publisher = Coalescer(lambda ns: self._if_leading(publish_namespace, ns))
        self.side_statuses = Coalescer(lambda ns: self._if_leading(apply_side_statuses, ns))

    @property
    def leading(self) -> bool:
        """Whether this replica may act (it holds the Lease, or there is no election)."""
        return self.leader is None or self.leader.leading

    async def _if_leading(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        if self.leading:
            await fn(self, *args)

    async def resync(self) -> None:
        """Reconcile every known pool and publish every known namespace (on becoming the
        leader: a standby saw every change but acted on none)."""
        for namespace, pools in list(self.cache.pools.items()):
            for name in list(pools):
                self.spawn(self.pools.request((namespace, name)))
        namespaces = {*self.cache.pools, *self.cache.policies, *self.cache.budgets}
        for namespace in sorted(namespaces):
            self.spawn(self.publisher.request(namespace))

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, keeping a reference until it ends."""
        task = asyncio.create_task(work)
        self.background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.metrics.errors.labels("background").inc()
            log.warning("background work failed: %r", task.exception())
