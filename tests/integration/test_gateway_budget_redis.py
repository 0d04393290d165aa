"""Budgets in a REAL Redis through REAL ``kvpool gateway`` processes (fake engine: the engine
plays no part in budgets).

- Namespaces: tenant ``shared`` of ``team-b`` spends its whole budget through its gateway;
  tenant ``shared`` of ``team-a``, through another gateway on the same Redis, still has all
  of its own (before: one key per tenant name, team-b used up team-a's budget).
- Burst: 200 concurrent requests on a tier that fails closed, against a healthy Redis with
  the default timeout, get no spurious 503 ``budget_unavailable`` (before: the 5 ms
  default tripped the breaker and answered 503 to most of a 50-request burst).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.builders import AdmissionConfigBuilder
from tests.support.gateway import FakeEngine, GatewayProcesses
from tests.support.redis_server import RedisFactory

pytestmark = [pytest.mark.redis]

SHARED = {"Authorization": "Bearer sk-shared"}


def namespace_config(namespace: str, fake_engine: FakeEngine, limit: int) -> AdmissionConfigBuilder:
    return (
        AdmissionConfigBuilder(namespace=namespace)
        .tier("batch", floor=80, wait=5.0)
        .pool("tiny", [fake_engine.url], slots_per_replica=256, tokens_per_replica=1_000_000)
        .tenant("shared", key="sk-shared", tiers=["batch"], limits=[(60, limit)])
    )


async def post(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 10}
    async with session.post(f"{url}/v1/completions", json=body, headers=SHARED) as resp:
        return resp.status, await resp.json()


async def test_same_tenant_in_two_namespaces_has_two_budgets(
    fake_engine: FakeEngine, redis_server: RedisFactory, gateway_process: GatewayProcesses
) -> None:
    redis = redis_server()
    # a generous Redis timeout: this test is about keys, not about timeouts
    team_a, team_b = [
        await gateway_process.started(
            namespace_config(namespace, fake_engine, limit=200),
            redis_url=redis.url,
            extra_args=("--redis-timeout", "1"),
        )
        for namespace in ("team-a", "team-b")
    ]
    async with aiohttp.ClientSession() as session:
        b_results = [await post(session, team_b.url) for _ in range(30)]
        b_served = sum(1 for status, _ in b_results if status == 200)
        assert 429 in [status for status, _ in b_results]  # team-b's budget is spent
        a_results = [await post(session, team_a.url) for _ in range(3)]
    a_statuses = [status for status, _ in a_results]
    assert a_statuses == [200, 200, 200], (
        f"team-a's tenant 'shared' got {a_statuses} after team-b's 'shared' was served "
        f"{b_served} requests: {a_results[0][1]}"
    )


async def test_a_200_request_burst_against_a_healthy_redis_gets_no_503(
    fake_engine: FakeEngine, redis_server: RedisFactory, gateway_process: GatewayProcesses
) -> None:
    redis = redis_server()
    proc = await gateway_process.started(
        namespace_config("team-a", fake_engine, limit=10_000_000),
        redis_url=redis.url,
        extra_args=("--fail-closed-tier", "batch"),
    )
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        results = await asyncio.gather(*(post(session, proc.url) for _ in range(200)))
    metrics = await asyncio.to_thread(_get, proc.metrics_url)
    codes = [body.get("error", {}).get("code") for status, body in results if status != 200]
    assert codes == [], (
        f"{len(codes)} of 200 requests failed against a healthy Redis: "
        f"{codes.count('budget_unavailable')} budget_unavailable, codes {sorted(set(codes))}"
    )
    assert "kvpool_gateway_redis_errors_total{" not in metrics
    assert "kvpool_gateway_budget_fallback_total{" not in metrics


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())
