"""Streams sent to their engine ahead of their budget verdict, on a REAL Redis and the real
upstream (over a socket to the fake engine, which records what it got and what was closed).

- A stream of a tenant well within its budget reaches its engine while its charge is held
  on its way, and its client gets no byte (not even the headers) before the verdict; then
  it is answered and charged exactly as a request that waited.
- Two gateways on one Redis: one spends the tenant's budget while the other's view of it
  is still young. The other's next stream goes ahead and is refused by its verdict: the
  client gets the 429 of a request that waited, the engine request is closed at its first
  token, and Redis never holds more than the limit.
- The same for a ``Demote`` tenant: the stream refused after it was sent is admitted
  again in the lower tier (its second engine request carries that tier's priority) and
  the client gets one answer, the demoted one.
- A stream that ends before its gate (its engine refused it, its client left while it
  waited there) is settled once its verdict comes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from kvpool.adapters.budget import FailoverBudgetStore, RedisBudgetStore, budget_subject
from kvpool.adapters.budget.protocol import StoreVerdict, UnavailableMode
from kvpool.api.admission_config import BudgetWindow
from tests.builders import AdmissionConfigBuilder
from tests.support.gateway import FakeEngine
from tests.support.redis_server import RedisFactory
from tests.support.upstream import FakeAnswer, FakeUpstream

pytestmark = [pytest.mark.redis]

KEY = {"Authorization": "Bearer sk-t"}
LIMIT = 300  # tokens a minute: about 20 requests of 5 + 10 tokens


class HeldStore(FailoverBudgetStore):
    """The Redis budget store (behind the failover wrapper, as the gateway runs it) with a
    door in front of its verdicts: while ``door`` is shut, a charge is on its way."""

    def __init__(self, url: str) -> None:
        super().__init__(RedisBudgetStore(url, timeout=1.0))
        self.door = asyncio.Event()
        self.door.set()

    async def reserve(
        self,
        subject: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
        when_unavailable: UnavailableMode | None = None,
    ) -> StoreVerdict:
        await self.door.wait()
        return await super().reserve(subject, limits, tokens, now, tier, when_unavailable)


def config(engine: FakeEngine, over_budget: str = "Reject") -> AdmissionConfigBuilder:
    return (
        AdmissionConfigBuilder(namespace="team")
        .tier("interactive", floor=50, wait=5.0, engine_priority=0)
        .tier("batch", floor=30, wait=5.0, engine_priority=10)
        .rule("interactive", path_prefix="/v1/completions")
        .pool("tiny", [engine.url], slots_per_replica=64, tokens_per_replica=100_000)
        .tenant(
            "t",
            key="sk-t",
            tiers=["interactive", "batch"],
            limits=[(60, LIMIT)],
            over_budget=over_budget,  # type: ignore[arg-type]
        )
    )


async def stream(client: TestClient[Any, Any]) -> tuple[int, str]:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 10, "stream": True}
    async with client.post("/v1/completions", json=body, headers=KEY) as resp:
        return resp.status, await resp.text()


def overlap_count(metrics: str, result: str) -> float:
    line = f'kvpool_gateway_budget_overlap_total{{result="{result}"}} '
    for row in metrics.splitlines():
        if row.startswith(line):
            return float(row[len(line) :])
    return 0.0


async def until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def redis_usage(url: str) -> int:
    store = RedisBudgetStore(url)
    try:
        limits = [BudgetWindow(window_seconds=60, tokens=LIMIT)]
        [usage] = await store.usage(budget_subject("team", "t"), limits, time.time())
        return usage.tokens
    finally:
        await store.close()


async def test_a_stream_reaches_its_engine_but_not_its_client_before_its_verdict(
    fake_engine: FakeEngine, redis_server: RedisFactory, gateway_client: Any
) -> None:
    redis = redis_server()
    store = HeldStore(redis.url)
    client, gateway = await gateway_client(config(fake_engine), store)
    assert (await stream(client))[0] == 200  # no view yet: it waited for its verdict

    store.door.clear()
    ahead = asyncio.create_task(stream(client))
    await until(lambda: len(fake_engine.received) == 2)  # the engine has it
    await asyncio.sleep(0.3)
    assert not ahead.done(), "the client got an answer before the budget verdict"
    store.door.set()
    status, text = await ahead
    assert status == 200 and text.count('"text": "x"') == 10

    metrics = gateway.metrics.render().decode()
    assert overlap_count(metrics, "no-view") == 1
    assert overlap_count(metrics, "overlap") == 1
    # charged as if it had waited: both settle at what the engine reported (5 + 10)
    await gateway.tasks.wait(timeout=5)
    assert await redis_usage(redis.url) == 30


async def test_a_stream_refused_after_it_was_sent_gets_429_and_its_engine_request_closed(
    fake_engine: FakeEngine, redis_server: RedisFactory, gateway_client: Any
) -> None:
    redis = redis_server()
    client_a, gateway_a = await gateway_client(config(fake_engine), HeldStore(redis.url))
    client_b, _ = await gateway_client(config(fake_engine), HeldStore(redis.url))
    assert (await stream(client_a))[0] == 200  # A's view: 15 of 300 used
    for _ in range(40):  # B spends the rest while A's view is young
        if (await stream(client_b))[0] == 429:
            break
    else:
        pytest.fail("B never ran out of budget")

    fake_engine.chunk_delay = 0.2  # the engine would stream for 2 s
    received = len(fake_engine.received)
    status, text = await stream(client_a)

    assert status == 429 and json.loads(text)["error"]["code"] == "budget_exceeded", text
    assert len(fake_engine.received) == received + 1  # it went ahead to the engine
    await until(lambda: fake_engine.cancelled == 1)  # and was closed at its first token
    metrics = gateway_a.metrics.render().decode()
    assert overlap_count(metrics, "refused") == 1
    await gateway_a.tasks.wait(timeout=5)
    assert await redis_usage(redis.url) <= LIMIT


async def test_a_stream_demoted_after_it_was_sent_is_admitted_again_in_the_lower_tier(
    fake_engine: FakeEngine, redis_server: RedisFactory, gateway_client: Any
) -> None:
    redis = redis_server()
    demote = config(fake_engine, over_budget="Demote")
    client_a, gateway_a = await gateway_client(demote, HeldStore(redis.url))
    client_b, gateway_b = await gateway_client(demote, HeldStore(redis.url))
    assert (await stream(client_a))[0] == 200
    for _ in range(40):  # B spends the budget, until its own requests are demoted
        await stream(client_b)
        if demoted(gateway_b.metrics.render().decode()):
            break
    else:
        pytest.fail("B's requests were never demoted")

    fake_engine.chunk_delay = 0.05
    received = len(fake_engine.received)
    status, text = await stream(client_a)

    assert status == 200 and text.count('"text": "x"') == 10, text
    sent = fake_engine.received[received:]
    assert [body.get("priority") for body in sent] == [0, 10]  # ahead, then demoted
    await until(lambda: fake_engine.cancelled == 1)  # the one sent ahead was closed
    metrics = gateway_a.metrics.render().decode()
    assert overlap_count(metrics, "refused") == 1
    assert demoted(metrics) == 1


def demoted(metrics: str) -> float:
    """Requests demoted by their budget, from the interactive tier of pool tiny."""
    for row in metrics.splitlines():
        if row.startswith("kvpool_gateway_admission_decisions_total{") and all(
            label in row for label in ('outcome="demoted"', 'tier="interactive"')
        ):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


async def test_a_stream_whose_engine_failed_before_its_verdict_is_settled_when_it_comes(
    redis_server: RedisFactory, gateway_client: Any
) -> None:
    redis = redis_server()
    store = HeldStore(redis.url)
    upstream = FakeUpstream([FakeAnswer(), FakeAnswer.refused()])
    client, gateway = await gateway_client(config(FakeEngine()), store, upstream=upstream)
    assert (await stream(client))[0] == 200  # settles at 5 + 4

    store.door.clear()
    status, text = await stream(client)  # sent ahead; the engine refuses the connection
    assert status == 503 and json.loads(text)["error"]["code"] == "engine_unavailable"
    store.door.set()  # its verdict comes after its end: the charge must not stay
    await gateway.tasks.wait(timeout=5)

    metrics = gateway.metrics.render().decode()
    assert overlap_count(metrics, "overlap") == 0  # no gate ran
    assert overlap_count(metrics, "ended") == 1
    assert await redis_usage(redis.url) == 9  # the engine never saw it: settled at 0
    charged = gateway.metrics.render().decode()
    assert 'kvpool_gateway_tenant_tokens_charged_total{tenant="t",window="1m"} 9.0' in charged


async def test_a_client_that_leaves_while_its_stream_waits_at_the_gate_is_settled(
    fake_engine: FakeEngine, redis_server: RedisFactory, gateway_client: Any
) -> None:
    """Given a stream sent ahead waits at its gate (the engine has answered its first
    chunk, the verdict is on its way), when its client leaves, then the engine request is
    closed and, once the verdict comes, the charge is settled: not left at what was
    reserved, and not counted as a stream that went through its gate."""
    redis = redis_server()
    store = HeldStore(redis.url)
    client, gateway = await gateway_client(config(fake_engine), store)
    assert (await stream(client))[0] == 200  # settles at 5 + 10
    assert await redis_usage(redis.url) == 15

    fake_engine.chunk_delay = 0.2  # the engine would stream for 2 s
    store.door.clear()
    leaving = asyncio.create_task(stream(client))
    await until(lambda: len(fake_engine.received) == 2)  # sent ahead
    await asyncio.sleep(0.3)  # its first chunk is in: it waits at the gate
    leaving.cancel()  # the client leaves
    with pytest.raises(asyncio.CancelledError):
        await leaving
    await until(lambda: fake_engine.cancelled == 1)  # the engine request is closed
    store.door.set()  # its verdict comes after its end
    await gateway.tasks.wait(timeout=5)

    metrics = gateway.metrics.render().decode()
    assert overlap_count(metrics, "overlap") == 0  # it never passed its gate
    assert overlap_count(metrics, "ended") == 1
    # settled at what the request's end says (its prompt and what the engine made before
    # it was closed: 12 here), not left at the 15 tokens its reservation held
    settled = await redis_usage(redis.url) - 15
    assert 0 < settled < 15, f"settled at {settled} of the 15 reserved"
