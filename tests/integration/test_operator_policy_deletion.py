"""Deleting a TierPolicy that pools use is not an outage: the real gateway keeps serving.

Given the operator, a pool served by an engine (a fake OpenAI upstream, reached through
the pool's static endpoints) and the real ``kvpool gateway`` process reading the
operator's ConfigMap: deleting the policy waits on its ``kvpool.dev/in-use`` finalizer;
even when the finalizer is removed by hand and the policy is gone, the config keeps the
last good compiled policy (``stale: true``) and requests keep succeeding. Deleting the
pool then releases the finalizer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.integration.test_operator import (
    API_KEY,
    admission_config,
    condition,
    given_policy_tenant_and_pool,
    mp,
    status,
    tp,
)
from tests.operator_process import OperatorProcess
from tests.support.gateway import FakeEngine, GatewayProcess, GatewayProcesses
from tests.support.kube import KubeApi
from tests.support.waiting import wait_until

FINALIZER = "kvpool.dev/in-use"


async def completion(session: aiohttp.ClientSession, gateway: GatewayProcess) -> int:
    body = {"model": "chat", "prompt": "hello", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with session.post(f"{gateway.url}/v1/completions", json=body, headers=headers) as rsp:
        await rsp.read()
        return rsp.status


def served(config: dict[str, Any]) -> bool:
    """The pool has its endpoint and the policy its rule."""
    pools, policies = config["pools"], config["tierPolicies"]
    return bool(pools and pools[0]["tracks"][0]["endpoints"] and policies[0]["classification"])


async def until(fn: Any, timeout: float = 15.0) -> Any:
    return await asyncio.to_thread(wait_until, fn, timeout)


async def test_deleting_a_policy_in_use_keeps_the_gateway_serving(
    kube_api: KubeApi,
    operator: OperatorProcess,
    fake_engine: FakeEngine,
    gateway_process: GatewayProcesses,
) -> None:
    # Given a pool served by one engine, planned and published, and a gateway on it
    given_policy_tenant_and_pool(kube_api)
    rules = [{"pathPrefix": "/v1/", "tier": "interactive"}]
    kube_api.client.patch(tp("tiers"), {"spec": {"classification": rules}})
    kube_api.client.patch(
        mp("chat"),
        {"metadata": {"annotations": {"kvpool.dev/static-endpoints": f"e1={fake_engine.url}"}}},
    )
    await until(lambda: served(admission_config(kube_api)))
    gateway = await gateway_process.started(
        configmap=("default", kube_api.url), extra_args=("--reload-interval", "0.1")
    )
    async with aiohttp.ClientSession() as session:
        assert await completion(session, gateway) == 200
        await until(lambda: FINALIZER in kube_api.client.get(tp("tiers"))["metadata"].get(
            "finalizers", []))  # fmt: skip

        # When the policy is deleted, the finalizer holds it: nothing changes
        kube_api.client.delete(tp("tiers"))
        await until(lambda: kube_api.client.get(tp("tiers"))["metadata"]["deletionTimestamp"])
        assert await completion(session, gateway) == 200

        # When the finalizer is removed by hand, the policy is gone...
        kube_api.client.patch(tp("tiers"), {"metadata": {"finalizers": None}})
        await until(lambda: kube_api.client.request("GET", tp("tiers")).status == 404)
        await until(lambda: condition(status(kube_api), "Ready") == ("False", "TierPolicyNotFound"))
        kept = await until(lambda: admission_config(kube_api)["tierPolicies"][0])
        assert kept["stale"] is True and "not found" in kept["staleReason"]
        # ...and the gateway keeps serving with the last good compiled policy
        await until(  # the gateway has reloaded the ConfigMap as published now
            lambda: gateway.config_generated_at() == admission_config(kube_api)["generatedAt"]
        )
        statuses = [await completion(session, gateway) for _ in range(5)]
        assert statuses == [200] * 5, gateway.log_tail()
        assert len(fake_engine.received) >= 7


def test_deleting_the_last_pool_releases_the_policy(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: FINALIZER in kube_api.client.get(tp("tiers"))["metadata"].get(
        "finalizers", []))  # fmt: skip
    kube_api.client.delete(tp("tiers"))
    wait_until(lambda: kube_api.client.get(tp("tiers"))["metadata"].get("deletionTimestamp"))

    # When the only pool using it is deleted, the policy's deletion completes
    kube_api.client.delete(mp("chat"))
    wait_until(lambda: kube_api.client.request("GET", tp("tiers")).status == 404)
    wait_until(lambda: admission_config(kube_api)["tierPolicies"] == [])
