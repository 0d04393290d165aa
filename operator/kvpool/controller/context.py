"""The state one operator process shares between its handlers, and its three work queues.

Why it exists: the handlers (:mod:`.handlers`), the pool reconciler (:mod:`.pool`), the
config publisher (:mod:`.publisher`) and the side statuses (:mod:`.side_statuses`) work
on the same clients, cache, metrics and last-written statuses. :class:`Operator` holds
them and wires the coalescing queues (:mod:`.coalescer`) to the functions they run:

    pools          (namespace, name) -> reconcile_pool     observe, plan, apply, status
    publisher      namespace         -> publish_namespace  compile and write the config
    side_statuses  namespace         -> apply_side_statuses TierPolicy/TenantBudget status

The work modules only name :class:`Operator` in annotations, so they import nothing from
here at run time (no import cycle).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from kvpool.adapters import kube
from kvpool.adapters.prometheus import SnapshotCache
from kvpool.api.modelpool import ModelPoolStatus
from kvpool.controller.cache import Cache
from kvpool.controller.coalescer import Coalescer
from kvpool.controller.config import OperatorConfig
from kvpool.controller.metrics import OperatorMetrics
from kvpool.controller.pool import reconcile_pool
from kvpool.controller.publisher import publish_namespace
from kvpool.controller.side_statuses import apply_side_statuses


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
    pools: Coalescer = field(init=False)
    publisher: Coalescer = field(init=False)
    side_statuses: Coalescer = field(init=False)
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.pools = Coalescer(lambda key: reconcile_pool(self, *key))
        self.publisher = Coalescer(lambda ns: publish_namespace(self, ns))
        self.side_statuses = Coalescer(lambda ns: apply_side_statuses(self, ns))
