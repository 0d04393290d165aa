"""What one operator process shares between its work: clients, cache, metrics, clock and
the statuses and configs it last wrote.

Why it exists: the pool reconciler (:mod:`.pool`), the config publisher (:mod:`.publisher`),
the side statuses (:mod:`.side_statuses`) and the watches (:mod:`.watches`) work on the
same clients and memory. :class:`OperatorState` holds them and nothing that runs work: it
imports no work module, so a work module importing it makes no circle, and the queues that
run the work are wired in one place (:mod:`.wiring`). A work module's inner functions take
only the parts they use (the cache, the client, ``statuses``), not the whole state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpool.adapters.background import BackgroundTasks
from kvpool.adapters.kube import KubeClient
from kvpool.adapters.prometheus import SnapshotCache
from kvpool.api.admission_config import AdmissionConfig
from kvpool.api.modelpool import ModelPoolStatus
from kvpool.controller.cache import Cache
from kvpool.controller.clock import Clock, SystemClock
from kvpool.controller.config import OperatorConfig
from kvpool.controller.local_mode import StaticEndpoints
from kvpool.controller.metrics import OperatorMetrics

PoolKey = tuple[str, str]  # (namespace, name)


@dataclass
class OperatorState:
    """The memory and clients the operator's work shares (no queues, no work)."""

    config: OperatorConfig
    kube: KubeClient
    snapshots: SnapshotCache  # the shared Prometheus snapshot
    metrics: OperatorMetrics
    clock: Clock = field(default_factory=SystemClock)
    cache: Cache = field(default_factory=Cache)  # policies, budgets, key digests, pools, pods
    # the ModelPool statuses this process wrote last, by (namespace, name)
    statuses: dict[PoolKey, ModelPoolStatus] = field(default_factory=dict)
    # TierPolicy/TenantBudget statuses last written, by (plural, namespace, name)
    written: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    # the admission config last published per namespace (None: none or unreadable)
    published: dict[str, AdmissionConfig | None] = field(default_factory=dict)
    static: StaticEndpoints = field(init=False)  # local mode (--allow-static-endpoints)
    tasks: BackgroundTasks = field(init=False)  # failures counted in errors{stage=label}

    def __post_init__(self) -> None:
        self.static = StaticEndpoints(self.config.allow_static_endpoints)
        self.tasks = BackgroundTasks(on_failure=self._count_failure)

    def _count_failure(self, label: str) -> None:
        self.metrics.errors.labels(label).inc()
