"""The lease keeper's renewal on a real Redis, two replicas in one process: it asks a
second time in one renewal only when the answer brought other replicas' reports that
change its wish, never because its own demand moved while the first call was in flight
(that is the next renewal's; recomputing and re-asking for it doubled a replica's
renewals under a flood); and a chat that waits for floor another replica holds is
hurried through urgent nudges instead of waiting out the renewals' wake gap."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from kvpool.adapters.background import BackgroundTasks
from kvpool.adapters.lease.store import PlanRenewal, RedisLeaseStore, Renewal
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.domain.admission import AdmissionRequest, Admit
from kvpool.domain.lease import LeaseClock
from kvpool.gateway.config_index import ConfigIndex
from kvpool.gateway.leases import LeaseKeeper
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.registry import PoolRegistry
from tests.builders import AdmissionConfigBuilder
from tests.support.redis_server import RedisFactory, RedisServer
from tests.support.waiting import wait_until_async

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
    metrics: GatewayMetrics
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
async def replicas(server: RedisServer) -> AsyncIterator[Callable[..., Replica]]:
    namespace = f"keeper{next(NAMESPACES)}"
    prefix = RedisLeaseStore(server.url, namespace).prefix
    client = aioredis.Redis.from_url(server.url)
    now_s, now_us = await client.time()  # past Redis's warm-up: leases grow at once
    await client.set(f"{prefix}:epoch", now_s * 1000 + now_us // 1000 - 60_000)
    await client.aclose()
    made: list[Replica] = []

    def make(name: str, clock: LeaseClock | None = None) -> Replica:
        store = CountingStore(server.url, namespace, timeout=2.0)
        metrics = GatewayMetrics()
        keeper = LeaseKeeper(store, metrics, member=name, clock=clock)
        tasks = BackgroundTasks()
        registry = PoolRegistry(metrics, keeper, TokenizerCache(), tasks)
        index = config()
        keeper.attach(lambda: registry.runtimes, registry.refresh_capacity)
        keeper.configure(index.config)
        registry.sync(index)
        made.append(Replica(keeper, store, metrics, registry, tasks))
        return made[-1]

    yield make
    for replica in made:
        for runtime in replica.registry.runtimes.values():
            runtime.close()
        await replica.tasks.cancel()
        await replica.store.close()


async def test_own_demand_moving_during_the_call_does_not_ask_twice(
    replicas: Callable[..., Replica],
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
    replicas: Callable[..., Replica],
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


async def test_a_chat_waiting_for_floor_held_elsewhere_is_hurried_through_urgent_nudges(
    replicas: Callable[..., Replica], server: RedisServer
) -> None:
    # a period so long that only the urgent path can admit within the test: a renewal
    # woken early waits half a period (30 s) after the last one (the TTLs are the test's
    # length; the member TTL within the fixture's Redis warm-up of 60 s)
    clock = LeaseClock(period=60.0, lease_ttl=20.0, member_ttl=30.0, redis_timeout=2.0)
    a, b = replicas("a", clock), replicas("b", clock)
    a.queue("interactive", 1)  # the chats' floor is at a, where they arrived
    for keeper in (a.keeper, b.keeper, a.keeper, b.keeper):
        await keeper.renew()  # each has just renewed: a wake now waits 30 s, unless urgent
    a.tasks.spawn(a.keeper.run(), "a renews")
    b.tasks.spawn(b.keeper.run(), "b renews")
    async with recorded_nudges(server, a.store.nudge_channel) as nudges:
        runtime = b.registry.runtimes[POOL]
        # b, new here, stands by with room for one chat; the second needs a's floor
        first, second = (chat(f"b-chat-{i}") for i in (1, 2))
        assert isinstance(await runtime.admit(first), Admit)
        verdict = await asyncio.wait_for(runtime.admit(second), timeout=10.0)
        await asyncio.sleep(0.2)  # the last nudges reach the recorder
    assert isinstance(verdict, Admit)
    # b asked (urgent for two more hops), a gave the floor up (urgent for b), then plain
    assert nudges[:2] == ["b 2", "a 1"], nudges
    hurried = "kvpool_gateway_lease_hurried_renewals_total"
    assert b.metrics.registry.get_sample_value(hurried, {"cause": "waiting"}) == 1
    assert (a.metrics.registry.get_sample_value(hurried, {"cause": "nudge"}) or 0) >= 1


async def test_a_nudge_claiming_more_urgent_hops_than_a_chat_sends_is_cut_to_them(
    replicas: Callable[..., Replica], server: RedisServer
) -> None:
    clock = LeaseClock(period=60.0, lease_ttl=20.0, member_ttl=30.0, redis_timeout=2.0)
    a, b = replicas("a", clock), replicas("b", clock)
    a.queue("interactive", 1)
    for keeper in (a.keeper, b.keeper, a.keeper, b.keeper):
        await keeper.renew()
    runtime = b.registry.runtimes[POOL]
    assert isinstance(await runtime.admit(chat("b-chat-1")), Admit)  # on b's standby
    waiting = asyncio.create_task(runtime.admit(chat("b-chat-2")))  # needs a's floor
    await b.keeper.renew()  # b reports it, not hurried (b's keeper does not run)
    a.tasks.spawn(a.keeper.run(), "a renews")
    async with recorded_nudges(server, a.store.nudge_channel) as nudges:
        forger = aioredis.Redis.from_url(server.url)
        await forger.publish(a.store.nudge_channel, "x 9")  # far past URGENT_HOPS
        await forger.aclose()

        def from_a() -> list[str]:
            return [n for n in nudges if n.split(" ")[0] == "a"]

        async def a_gave_the_floor_up() -> bool:
            await asyncio.sleep(0.05)
            return bool(from_a())

        await wait_until_async(a_gave_the_floor_up, timeout=10, what="a's nudge")
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    # a renewed at once (hurried by the nudge), and passed on one hop, not eight
    assert from_a()[0] == "a 1", nudges


def chat(request_id: str) -> AdmissionRequest:
    return AdmissionRequest(request_id=request_id, tenant="t", tier="interactive", tokens=300)


@contextlib.asynccontextmanager
async def recorded_nudges(server: RedisServer, channel: str) -> AsyncIterator[list[str]]:
    """Every nudge published on ``channel`` while the block runs, in order."""
    client = aioredis.Redis.from_url(server.url)
    listener = client.pubsub(ignore_subscribe_messages=True)
    await listener.subscribe(channel)
    nudges: list[str] = []

    async def record() -> None:
        while True:
            message = await listener.get_message(timeout=1.0)
            if message is not None:
                nudges.append(message["data"].decode())

    recorder = asyncio.create_task(record())
    try:
        yield nudges
    finally:
        recorder.cancel()
        await asyncio.gather(recorder, return_exceptions=True)
        await listener.aclose()
        await client.aclose()
