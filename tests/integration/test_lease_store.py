"""The lease script on a real Redis: the same grants as its reference model on random
inputs, membership that expires by Redis's clock, the warm-up after a restart, and reports
that come back as they were sent."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool.adapters.lease.store import (
    LeaseStoreError,
    PlanRenewal,
    RedisLeaseStore,
    decode_report,
    encode_report,
)
from kvpool.domain.admission.amount import Amount
from kvpool.domain.lease import Report, TierDemand, decide_grant
from kvpool.domain.lease.model import sum_components
from tests.support.redis_server import RedisFactory, RedisServer
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.redis

NAMESPACES = itertools.count()
COMPONENTS = ["floor.slots.a", "loan.slots.a", "shared.slots", "tenant.x"]
GROUPS = {
    "floor.slots.a": (4, ("floor.slots.a", "loan.slots.a")),
    "shared.slots": (3, ("shared.slots",)),
    "tenant.x": (2, ("tenant.x",)),
}


@pytest.fixture(scope="module")
def server(redis_server_module: RedisFactory) -> RedisServer:
    return redis_server_module()


@pytest.fixture
async def client(server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(server.url)
    yield redis
    await redis.aclose()


@pytest.fixture
async def stores() -> AsyncIterator[list[RedisLeaseStore]]:
    """Stores a test opened; closed at its end, whether it passed or not."""
    opened: list[RedisLeaseStore] = []
    yield opened
    for store in opened:
        await store.close()


def renewal(desired: dict[str, int], held: dict[str, int], report: Report | None = None):
    return PlanRenewal("pool", "stable", GROUPS, desired, held, report or Report())


async def warmed_store(server: RedisServer, client: aioredis.Redis) -> RedisLeaseStore:
    """A store on a fresh namespace whose Redis has run for a while (no warm-up)."""
    namespace = f"ns{next(NAMESPACES)}"
    store = RedisLeaseStore(server.url, namespace, timeout=2.0)
    now_s, now_us = await client.time()
    await client.set(f"{store.prefix}:epoch", now_s * 1000 + now_us // 1000 - 60_000)
    return store


counts = st.dictionaries(st.sampled_from(COMPONENTS), st.integers(0, 5), max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(others=st.lists(counts, max_size=3), desired=counts, held=counts)
async def test_the_script_grants_what_its_reference_model_grants(
    server: RedisServer, client: aioredis.Redis, others, desired, held
) -> None:
    store = await warmed_store(server, client)
    try:
        for i, claim in enumerate(others):  # other members claim what they hold
            await store.renew(f"other-{i}", [renewal({}, claim)], member_ttl=30)
        renewed = await store.renew("me", [renewal(desired, held)], member_ttl=30)
        expected = decide_grant(GROUPS, sum_components(others), desired, held)
        assert renewed.plans[0].granted == expected.granted
        assert renewed.plans[0].claim == expected.claim
        assert renewed.members == len(others) + 1
        assert not renewed.warming
    finally:
        await store.close()


async def test_reports_come_back_as_sent(
    server: RedisServer, client: aioredis.Redis, stores: list[RedisLeaseStore]
) -> None:
    store = await warmed_store(server, client)
    stores.append(store)
    sent = Report(
        tiers={
            "a": TierDemand(now=Amount(120, 1), peak=Amount(400, 3)),
            "b": TierDemand(now=Amount(900, 3), peak=Amount(900, 3), head_tokens=300),
        },
        tenants={"x": (1, 2)},
    )
    await store.renew("b", [renewal({}, {}, sent)], member_ttl=30)
    renewed = await store.renew("a", [renewal({}, {})], member_ttl=30)
    assert renewed.plans[0].reports == {"b": sent, "a": Report()}


async def test_a_member_that_stops_renewing_is_forgotten_with_its_claims(
    server: RedisServer, client: aioredis.Redis, stores: list[RedisLeaseStore]
) -> None:
    """Given b claims all of the shared remainder, when b stops renewing (SIGKILL), then
    after its member TTL (Redis's clock) a is granted it."""
    store = await warmed_store(server, client)
    stores.append(store)
    await store.renew("b", [renewal({}, {"shared.slots": 3})], member_ttl=0.3)
    first = await store.renew("a", [renewal({"shared.slots": 3}, {})], member_ttl=30)
    assert first.plans[0].granted == {} and first.members == 2

    async def granted() -> bool:
        renewed = await store.renew("a", [renewal({"shared.slots": 3}, {})], member_ttl=30)
        return renewed.plans[0].granted == {"shared.slots": 3} and renewed.members == 1

    await wait_until_async(granted, timeout=5, what="b's claims forgotten after its TTL")


async def test_a_member_that_leaves_is_forgotten_at_once_and_nudges(
    server: RedisServer, client: aioredis.Redis, stores: list[RedisLeaseStore]
) -> None:
    """Given b claims all of the shared remainder, when b leaves (it stopped, its requests
    ended), then a's next renewal is granted it and counts one member, and a nudge from b
    reached the others."""
    store = await warmed_store(server, client)
    stores.append(store)
    await store.renew("b", [renewal({}, {"shared.slots": 3})], member_ttl=30)
    first = await store.renew("a", [renewal({"shared.slots": 3}, {})], member_ttl=30)
    assert first.plans[0].granted == {} and first.members == 2
    nudges = client.pubsub(ignore_subscribe_messages=True)
    await nudges.subscribe(store.nudge_channel)
    await store.leave("b", [("pool", "stable")])
    senders = []

    async def nudged() -> bool:  # the first reads return the subscription's confirmation
        message = await nudges.get_message(timeout=0.2)
        if message is not None:
            senders.append(message["data"])
        return bool(senders)

    await wait_until_async(nudged, timeout=5, what="b's nudge")
    await nudges.aclose()
    assert senders == [b"b"]
    after = await store.renew("a", [renewal({"shared.slots": 3}, {})], member_ttl=30)
    assert after.plans[0].granted == {"shared.slots": 3} and after.members == 1


async def test_after_a_restart_nobody_grows_for_one_member_ttl(
    redis_server: RedisFactory, stores: list[RedisLeaseStore]
) -> None:
    """Given a restarted (empty) Redis, a replica that arrives first cannot take what the
    others still admit against: for one member TTL a grant never exceeds what is held."""
    server = redis_server()
    store = RedisLeaseStore(server.url, "restart", timeout=2.0)
    stores.append(store)
    renewed = await store.renew(
        "a", [renewal({"shared.slots": 3}, {"shared.slots": 1})], member_ttl=0.5
    )
    assert renewed.warming
    assert renewed.plans[0].granted == {"shared.slots": 1}

    async def grows() -> bool:
        again = await store.renew("a", [renewal({"shared.slots": 3}, {})], member_ttl=0.5)
        return not again.warming and again.plans[0].granted == {"shared.slots": 3}

    await wait_until_async(grows, timeout=5, what="the warm-up to end")


async def test_redis_down_is_a_store_error(
    redis_server: RedisFactory, stores: list[RedisLeaseStore]
) -> None:
    server = redis_server()
    store = RedisLeaseStore(server.url, "down", timeout=0.5)
    stores.append(store)
    server.kill()
    with pytest.raises(LeaseStoreError, match="Error"):
        await store.renew("a", [renewal({}, {})], member_ttl=3)
    with pytest.raises(LeaseStoreError, match="Error"):
        await store.leave("a", [("pool", "stable")])


def test_a_report_of_a_replica_of_before_reads_without_its_head_request() -> None:
    # during a rolling update, replicas of the previous version report four figures a tier
    old = {"t": {"a": [120, 1, 400, 3]}, "n": {}}
    assert decode_report(old) == Report({"a": TierDemand(Amount(120, 1), Amount(400, 3))})
    assert decode_report({"t": {"a": [1, 2, 3]}}) == Report()  # malformed: no demand


@pytest.mark.parametrize(
    "demand",
    [
        TierDemand(Amount(900, 3), Amount(900, 3), head_tokens=300, held=Amount(600, 2)),
        TierDemand(Amount(300, 1), Amount(300, 1), head_tokens=300),
        TierDemand(Amount(600, 2), Amount(600, 2), held=Amount(600, 2)),  # nothing waits
        TierDemand(Amount(0, 0), Amount(400, 3)),
        TierDemand(),  # the tier arrived lately, no demand now: still reported
    ],
)
def test_a_report_reads_back_as_it_was_written(demand: TierDemand) -> None:
    report = Report({"batch": demand}, {"acme": (2, 3)})
    assert decode_report(json.loads(json.dumps(encode_report(report)))) == report


def test_a_presumed_tier_reads_back_presumed_and_reads_as_come_to_a_replica_of_before() -> None:
    report = Report({"interactive": TierDemand()}, presumed=frozenset({"interactive"}))
    written = json.loads(json.dumps(encode_report(report)))
    assert decode_report(written) == report
    assert Report({"interactive": TierDemand()}) == decode_report({"t": written["t"]})
    assert decode_report({**written, "p": ["eval", 3]}).presumed == frozenset()  # not reported


def test_a_report_of_a_replica_of_before_reads_without_what_is_in_flight() -> None:
    # replicas before the in-flight figures report five a tier (the head request's tokens)
    assert decode_report({"t": {"a": [120, 1, 400, 3, 90]}}) == Report(
        {"a": TierDemand(Amount(120, 1), Amount(400, 3), head_tokens=90)}
    )


def test_a_replica_of_before_reads_the_tier_figures_of_a_new_report() -> None:
    # what is in flight is a key of its own: the tier's figures keep their old shape
    demand = TierDemand(Amount(900, 3), Amount(900, 3), head_tokens=300, held=Amount(600, 2))
    encoded = encode_report(Report({"batch": demand}))
    assert encoded["t"] == {"batch": [900, 3, 900, 3, 300]}
    assert decode_report({"t": encoded["t"], "h": {"batch": [600]}}) == Report(
        {"batch": TierDemand(Amount(900, 3), Amount(900, 3), head_tokens=300)}
    )  # a malformed in-flight figure reads as none, the demand stays


async def test_a_nudge_says_how_many_urgent_hops_are_left_and_skips_its_sender(
    server: RedisServer, stores: list[RedisLeaseStore]
) -> None:
    """Table: (sender, hops sent) -> what a listener that is not the sender hears; member
    ids with spaces or trailing digits arrive whole (only a " <digits>" suffix is hops)."""
    store = RedisLeaseStore(server.url, f"nudge{next(NAMESPACES)}", timeout=2.0)
    stores.append(store)
    heard: list[int] = []
    listening = asyncio.create_task(store.listen("me", heard.append))
    sent = [("b", 2), ("b", 1), ("b", 0), ("me", 2), ("pod 7a", 0), ("pod-2", 1)]
    expected = [2, 1, 0, 0, 1]  # "me" is this listener: not heard

    async def all_heard() -> bool:
        await asyncio.sleep(0.05)
        return len(heard) >= len(expected)

    async def subscribed() -> bool:  # a nudge before the subscription is lost
        await store.nudge("probe", 0)
        await asyncio.sleep(0.05)
        return bool(heard)

    try:
        await wait_until_async(subscribed, timeout=5, what="the subscription")
        await asyncio.sleep(0.1)
        heard.clear()
        for sender, hops in sent:
            await store.nudge(sender, hops)
        await wait_until_async(all_heard, timeout=5, what="the nudges")
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listening
    assert heard == expected
