"""This gateway replica's share of each plan: one replaceable object, asked everywhere.

Why this module exists: admission state (reservations, queues, a tenant's requests in
flight) lives in each gateway process, so with N replicas each may admit against only a
part of every pool's plan (:mod:`kvpool.domain.partition`). That share is applied in three
places - the pool a :class:`~kvpool.gateway.pool_runtime.PoolRuntime` admits against, a
tenant's ``maxConcurrency``, and how often the engines' ``/metrics`` are polled - and all
three must agree. :class:`CapacityShare` is the one object they ask. The default,
:class:`StaticShare`, is the fixed ``--plan-share`` percent; a share that changes while the
gateway runs (capacity leases from a coordinator, say) implements the same three methods
and calls :meth:`kvpool.gateway.registry.PoolRegistry.refresh_capacity` when a pool's
share moved: the pool's runtime adopts the new view at once, keeping the reservations in
flight, without a new config.

Worked example: at ``StaticShare(50)``, a pool planned at 1,843 tokens / 8 slots per
replica is admitted against 921 tokens / 4 slots here, a tenant limited to 5 concurrent
requests may run 2 through this replica, and an engine polled every 0.25 s by all
replicas together is polled every 0.5 s by this one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvpool.api.admission_config import (
    AdmissionConfig,
    CompiledPool,
    CompiledTenant,
    CompiledTier,
)
from kvpool.domain.partition import partition_poll_period, partition_pool, partition_tenant
from kvpool.gateway.pool_runtime import PoolRuntime


class CapacityShare(Protocol):
    """What part of the plans this gateway replica admits against."""

    def pool_view(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> CompiledPool:
        """The part of ``pool``'s plan (floors, lendable parts, capacity) admitted here
        (``tiers``: the pool's policy tiers)."""
        ...

    def tenant_view(self, tenant: CompiledTenant, pool: str) -> CompiledTenant:
        """``tenant`` with the part of its limits enforced here for requests to ``pool``."""
        ...

    def poll_period(self, seconds: float) -> float:
        """How often this replica polls each engine, when all together poll every ``seconds``."""
        ...

    def configure(self, config: AdmissionConfig) -> None:
        """A new config was applied (before the pools are synced)."""
        ...

    def attach(
        self, runtimes: Callable[[], dict[str, PoolRuntime]], refresh: Callable[[str], None]
    ) -> None:
        """Where the pools' runtimes are, and how to re-apply a pool's share."""
        ...

    async def run(self) -> None:
        """Keep the share current until cancelled (returns at once if it never moves)."""
        ...

    def unready_reason(self) -> str | None:
        """Why this replica cannot admit anything now (``/readyz``), or None."""
        ...

    async def leave(self) -> None:
        """This replica stops for good, its requests ended: give its share back now."""
        ...


@dataclass(frozen=True)
class StaticShare:
    """A fixed percent of every plan: ``--plan-share`` (an explicit override of leases), or
    100 for a gateway without Redis (one replica)."""

    percent: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.percent <= 100:
            raise ValueError(f"the plan share must be 1-100 percent, got {self.percent}")

    def pool_view(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> CompiledPool:
        return partition_pool(pool, self.percent)

    def tenant_view(self, tenant: CompiledTenant, pool: str) -> CompiledTenant:
        return partition_tenant(tenant, self.percent)

    def poll_period(self, seconds: float) -> float:
        return partition_poll_period(seconds, self.percent)

    def configure(self, config: AdmissionConfig) -> None:
        return None

    def attach(
        self, runtimes: Callable[[], dict[str, PoolRuntime]], refresh: Callable[[str], None]
    ) -> None:
        return None

    async def run(self) -> None:
        return None

    def unready_reason(self) -> str | None:
        return None

    async def leave(self) -> None:
        return None
