"""Handover over real HTTP (in front of the fake engine): with ``--handover-tokens``, a
stream within that many tokens of its output bound gives its reservation to the next
request, which then reaches the engine while the first stream still runs; without it, the
next request starts only when the first one's stream ended. A stream with no bound the
gateway knows (n > 1) keeps its reservation to the end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvpool.domain.handover import NON_TOKEN_CHUNKS
from tests.builders import AdmissionConfigBuilder
from tests.support.gateway import FakeEngine, GatewayClientFactory

BULK = {"Authorization": "Bearer sk-bulk"}
OUTPUT = 20  # tokens of each answer
CHUNK_SECONDS = 0.03


def one_slot(url: str) -> AdmissionConfigBuilder:
    return (
        AdmissionConfigBuilder()
        .tier("batch", floor=100, wait=30.0)
        .pool("tiny", [url], tokens_per_replica=8192, slots_per_replica=1)
        .tenant("bulk", key="sk-bulk", tiers=["batch"])
    )


async def two_streams(client: Any, n: int = 1) -> list[int]:
    async def one() -> int:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": OUTPUT, "stream": True, "n": n}
        resp = await client.post("/v1/completions", json=body, headers=BULK)
        await resp.read()
        return int(resp.status)

    return list(await asyncio.gather(one(), one()))


@pytest.mark.parametrize(
    ("handover_tokens", "n", "overlap"),
    [
        pytest.param(0, 1, False, id="off-the-next-waits-for-the-end"),
        pytest.param(5, 1, True, id="on-the-next-starts-before-the-end"),
        pytest.param(5, 2, False, id="on-but-two-sequences-keep-theirs"),
    ],
)
async def test_a_stream_near_its_bound_hands_its_place_on(
    fake_engine: FakeEngine,
    gateway_client: GatewayClientFactory,
    handover_tokens: int,
    n: int,
    overlap: bool,
) -> None:
    fake_engine.chunk_delay = CHUNK_SECONDS
    client, _ = await gateway_client(one_slot(fake_engine.url), handover_tokens=handover_tokens)
    assert await two_streams(client, n) == [200, 200]
    assert fake_engine.max_in_flight == (2 if overlap else 1)
    first, second = fake_engine.arrivals
    if overlap:
        # not before the first stream certainly had at most 5 tokens to go
        relayed = OUTPUT - handover_tokens + NON_TOKEN_CHUNKS
        assert second - first >= 0.9 * (relayed - 1) * CHUNK_SECONDS
