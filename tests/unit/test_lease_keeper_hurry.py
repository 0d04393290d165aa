"""Which waiting requests hurry the lease renewals: a ``Preempt`` tier's, in its own pool.

Two pools whose TierPolicies both name a tier ``interactive``; only one of them reclaims it
by ``Preempt``. A request of it waiting in that pool wakes the keeper urgently (two hops,
plus one for its own nudge); one waiting in the other pool wakes it plainly (before, any
plan's ``Preempt`` tier of that name made both urgent: extra renewals, never capacity).
No renewal runs here: the keeper's ``wake`` records what it was asked.
"""

from __future__ import annotations

from kvpool.adapters.background import BackgroundTasks
from kvpool.adapters.lease.store import RedisLeaseStore
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import AdmissionConfig
from kvpool.gateway.config_index import ConfigIndex
from kvpool.gateway.leases import URGENT_HOPS, LeaseKeeper
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.registry import PoolRegistry
from tests.builders import AdmissionConfigBuilder
from tests.builders.compiled import Reclaim


class RecordingKeeper(LeaseKeeper):
    """The real keeper, whose wake-ups are recorded instead of renewing."""

    woken: list[int]

    def wake(self, urgency: int = 0) -> None:
        self.woken.append(urgency)


def one_policy(pool: str, reclaim: Reclaim) -> AdmissionConfig:
    """Pool ``pool`` under policy ``tiers``: interactive (reclaimed by ``reclaim``), batch."""
    return (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=30.0, reclaim=reclaim)
        .tier("batch", floor=30, wait=30.0)
        .pool(pool, ["http://127.0.0.1:9"])
        .obj()
    )


def two_policies() -> AdmissionConfig:
    """Pool ``chat`` under policy ``tiers`` (interactive: Preempt) and pool ``calm`` under
    policy ``calm`` (interactive: Wait)."""
    hurried, calm = one_policy("chat", "Preempt"), one_policy("calm", "Wait")
    calm_policy = calm.tier_policies[0].model_copy(update={"name": "calm"})
    calm_pool = calm.pools[0].model_copy(update={"tier_policy": "calm"})
    return hurried.model_copy(
        update={
            "tier_policies": [*hurried.tier_policies, calm_policy],
            "pools": [*hurried.pools, calm_pool],
        }
    )


async def test_only_a_preempt_tier_of_the_pool_where_it_waits_hurries() -> None:
    metrics = GatewayMetrics()
    keeper = RecordingKeeper(RedisLeaseStore("redis://127.0.0.1:9", "ns"), metrics, member="a")
    keeper.woken = []
    registry = PoolRegistry(metrics, keeper, TokenizerCache(), BackgroundTasks())
    index = ConfigIndex.build(two_policies())
    keeper.configure(index.config)
    registry.sync(index)
    # hooks every runtime there is (each renewal hooks them again)
    keeper.attach(lambda: registry.runtimes, registry.refresh_capacity)
    try:
        for pool in ("calm", "chat"):
            hook = registry.runtimes[pool].on_queued
            assert hook is not None
            hook("interactive")
            hook("batch")
    finally:
        for runtime in registry.runtimes.values():
            runtime.close()
        await keeper.store.close()
    assert keeper.woken == [0, 0, URGENT_HOPS + 1, 0]
