"""Rotating a tenant's API key without downtime, through the operator and the real gateway.

Given the operator, a pool served by a fake OpenAI upstream (static endpoints) and the
``kvpool gateway`` process following the operator's ConfigMap, a tenant ``acme`` with
one key: a second key is added (a new Secret key, referenced in ``apiKeySecretRefs``),
both keys authenticate while clients move, then the old one is dropped and answers 401.
The TenantBudget's ``KeyResolved`` condition says how many keys resolved at each step.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp

from tests.integration.test_operator import (
    API_KEY,
    admission_config,
    condition,
    core,
    given_policy_tenant_and_pool,
    mp,
    tb,
    tp,
)
from tests.operator_process import OperatorProcess
from tests.support.gateway import FakeEngine, GatewayProcess, GatewayProcesses
from tests.support.kube import KubeApi
from tests.support.waiting import wait_until

NEW_KEY = "sk-acme-rotated-456"


async def status_with(session: aiohttp.ClientSession, gateway: GatewayProcess, key: str) -> int:
    body = {"model": "chat", "prompt": "hello", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{gateway.url}/v1/completions", json=body, headers=headers) as rsp:
        await rsp.read()
        return rsp.status


def tenant_digests(kube: KubeApi) -> list[str]:
    (tenant,) = admission_config(kube)["tenants"]
    return [tenant["keySha256"], *tenant.get("additionalKeySha256", [])]


def budget_condition(kube: KubeApi, type_: str) -> tuple[Any, Any]:
    body = kube.client.get(tb("acme"))
    return condition(body.get("status") or {}, type_)


async def until(fn: Any, timeout: float = 15.0) -> Any:
    return await asyncio.to_thread(wait_until, fn, timeout)


async def test_a_second_key_works_with_the_first_then_alone(
    kube_api: KubeApi,
    operator: OperatorProcess,
    fake_engine: FakeEngine,
    gateway_process: GatewayProcesses,
) -> None:
    # Given a tenant with one key, served by the gateway
    given_policy_tenant_and_pool(kube_api)
    kube_api.client.patch(tp("tiers"), {"spec": {"classification": [
        {"pathPrefix": "/v1/", "tier": "interactive"}]}})  # fmt: skip
    kube_api.client.patch(
        mp("chat"),
        {"metadata": {"annotations": {"kvpool.dev/static-endpoints": f"e1={fake_engine.url}"}}},
    )
    await until(lambda: admission_config(kube_api)["tenants"])
    assert len(tenant_digests(kube_api)) == 1
    gateway = await gateway_process.started(
        configmap=("default", kube_api.url), extra_args=("--reload-interval", "0.1")
    )

    def reloaded() -> bool:
        return gateway.config_generated_at() == admission_config(kube_api)["generatedAt"]

    async with aiohttp.ClientSession() as session:
        assert await status_with(session, gateway, API_KEY) == 200
        assert await status_with(session, gateway, NEW_KEY) == 401

        # When a new key is added next to the old one (a referenced key not created yet
        # first: the tenant keeps working on the old key, and the condition says so)
        kube_api.client.patch(
            tb("acme"), {"spec": {"apiKeySecretRefs": [{"name": "acme-key", "key": "next"}]}}
        )
        await until(lambda: budget_condition(kube_api, "KeyResolved")
                    == ("True", "SomeSecretKeysNotFound"))  # fmt: skip
        encoded = base64.b64encode(NEW_KEY.encode()).decode()
        kube_api.client.patch(core("secrets", "acme-key"), {"data": {"next": encoded}})
        await until(lambda: len(tenant_digests(kube_api)) == 2)
        await until(reloaded)

        # Then both keys authenticate the same tenant
        both = [await status_with(session, gateway, k) for k in (API_KEY, NEW_KEY) * 3]
        assert both == [200] * 6, gateway.log_tail()
        assert budget_condition(kube_api, "KeyResolved") == ("True", "SecretKeyFound")

        # When the old key is removed (the new one becomes the only reference)
        kube_api.client.patch(
            tb("acme"),
            {"spec": {"apiKeySecretRef": {"name": "acme-key", "key": "next"},
                      "apiKeySecretRefs": None}},
        )  # fmt: skip
        await until(lambda: len(tenant_digests(kube_api)) == 1)
        await until(reloaded)

        # Then only the new key works
        assert await status_with(session, gateway, NEW_KEY) == 200
        assert await status_with(session, gateway, API_KEY) == 401
