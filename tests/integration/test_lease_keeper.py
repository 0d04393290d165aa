"""The lease keeper's renewal on a real Redis, two replicas in one process: it asks a
second time in one renewal only when the answer brought other replicas' reports that
change its wish, never because its own demand moved while the first call was in flight
(that is the next renewal's; recomputing and re-asking for it doubled a replica's
renewals under a flood)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from kvpool.adapters.background import BackgroundTasks
from kvpool.adapters.lease.store import PlanRenewal, RedisLeaseStore, Renewal
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.domain.admission import AdmissionRequest
from kvpool.gateway.config_index import ConfigIndex
from kvpool.gateway.leases import LeaseKeeper
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.registry import PoolRegistry
from tests.builders import AdmissionConfigBuilder
from tests.support.redis_server import RedisFactory, RedisServer

pytestmark = pytest.mark.redis

NAMESPACES = itertools.count()
POOL = "tiny"


@pytest.fixture(scope="module")
def server(redis_server_module: RedisFactory) -> RedisServer:
    return redis_server_module()


def config() -> ConfigIndex:
    return ConfigIndex.build(
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=30.0, reclaim="Preempt")
        .tier("batch", floor=30, lend=50, wait=30.0)
        .pool(POOL, ["http://127.0.0.1:9"], tokens_per_replica=2048, slots_per_replica=8)
        .obj()
    )


class CountingStore(RedisLeaseStore):
    """The real store; counts script calls and runs ``during`` inside each one."""

    calls = 0
    during: Callable[[], Awaitable[None]] | None = None

    async def renew(
        self, member: str, plans: Sequence[PlanRenewal], *, member_ttl: float
    ) -> Renewal:
        self.calls += 1
        if self.during is not None:
            during, self.during = self.during, None
            await during()
        return await super().renew(member, plans, member_ttl=member_ttl)


@dataclass
class Replica:
    keeper: LeaseKeeper
    store: CountingStore
    registry: PoolRegistry
    tasks: BackgroundTasks
    offered: list[str] = field(default_factory=list)

    def queue(self, tier: str, count: int) -> None:
        """Offer ``count`` requests of ``tier`` (left waiting or in flight; demand either way)."""
        runtime = self.registry.runtimes[POOL]
        for _ in range(count):
            rid = f"{self.keeper.member}-{len(self.offered)}"
            self.offered.append(rid)
            request = AdmissionRequest(request_id=rid, tenant="t", tier=tier, tokens=300)
            self.tasks.spawn(runtime.admit(request), f"offer {rid}")


@pytest.fixture
async def replicas(server: RedisServer) -> AsyncIterator[Callable[[str], Replica]]:
    namespace = f"keeper{next(NAMESPACES)}"
    prefix = RedisLeaseStore(server.url, namespace).prefix
    client = aioredis.Redis.from_url(server.url)
    now_s, now_us = await client.time()  # past Redis's warm-up: leases grow at once
    await client.set(f"{prefix}:epoch", now_s * 1000 + now_us // 1000 - 60_000)
    await client.aclose()
    made: list[Replica] = []

    def make(name: str) -> Replica:
        store = CountingStore(server.url, namespace, timeout=2.0)
        metrics = GatewayMetrics()
        keeper = LeaseKeeper(store, metrics, member=name)
        tasks = BackgroundTasks()
        registry = PoolRegistry(metrics, keeper, TokenizerCache(), tasks)
        index = config()
        keeper.attach(lambda: registry.runtimes, registry.refresh_capacity)
        keeper.configure(index.config)
        registry.sync(index)
        made.append(Replica(keeper, store, registry, tasks))
        return made[-1]

    yield make
    for replica in made:
        for runtime in replica.registry.runtimes.values():
            runtime.close()
        await replica.tasks.cancel()
        await replica.store.close()


async def test_own_demand_moving_during_the_call_does_not_ask_twice(
    replicas: Callable[[str], Replica],
) -> None:
    a, b = replicas("a"), replicas("b")
    b.queue("batch", 2)
    await b.keeper.renew()
    await a.keeper.renew()  # a's table now holds b's report
    await b.keeper.renew()
    await a.keeper.renew()
    a.store.calls = 0

    async def chats_arrive_here() -> None:
        a.queue("interactive", 3)  # a's wish moves: its floor by demand now

    a.store.during = chats_arrive_here
    await a.keeper.renew()
    assert a.store.calls == 1
    await a.keeper.renew()  # the next renewal carries the new demand
    assert a.store.calls == 2


async def test_the_others_reports_that_change_the_wish_are_asked_for_at_once(
    replicas: Callable[[str], Replica],
) -> None:
    a, b = replicas("a"), replicas("b")
    a.queue("batch", 6)
    await a.keeper.renew()
    await b.keeper.renew()
    await a.keeper.renew()
    a.store.calls = 0

    async def a_flood_arrives_at_b() -> None:
        b.queue("batch", 6)
        await b.keeper.renew()  # b reports it: a's fair share of batch shrinks

    a.store.during = a_flood_arrives_at_b
    await a.keeper.renew()
    assert a.store.calls == 2
