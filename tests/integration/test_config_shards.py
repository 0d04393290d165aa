"""Thousands of tenants against the API emulator: the 1 MiB ConfigMap limit, the sharded
publish and the gateway's unchanged polls (issue 18, item 5).

Given a namespace with 5,000 or 10,000 tenants (~230 bytes of compiled config each),
when the operator publishes the config, then every object stays under 900 KiB, the
gateway's ConfigMapSource assembles exactly the compiled config, and polls of the
unchanged config leave its event loop free (lag p99 under 10 ms).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from kvpool.adapters import kube
from kvpool.adapters.config_source import ConfigMapSource, KubeAccess
from kvpool.api.admission_config import CONFIGMAP_NAME, AdmissionConfig
from kvpool.controller.publisher import ConfigTooLargeError, apply_admission_config
from kvpool.domain import manifests as m
from kvpool.domain.compile import config_hash
from kvpool.domain.config_shards import data_bytes
from tests.builders.compiled import AdmissionConfigBuilder, standard_admission_config
from tests.support.kube import KubeApi, KubeApiError, resource_path
from tests.support.waiting import wait_until_async

NEAR_LIMIT = 900 * 1024


def many_tenants(count: int, endpoints: int = 1) -> AdmissionConfig:
    """The standard config with ``count`` tenants of ~230 bytes each (as issue 18 measured)."""
    urls = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(endpoints)]
    builder: AdmissionConfigBuilder = standard_admission_config(urls)
    for i in range(count):
        builder.tenant(
            f"tenant-{i:05d}",
            key=f"sk-{i}",
            tiers=["interactive", "batch"],
            limits=[(3600, 1_000_000)],
            labels={"team": f"team-{i % 40}"},
        )
    return builder.obj()


@pytest.fixture
async def client(kube_api: KubeApi) -> AsyncIterator[kube.KubeClient]:
    c = kube.KubeClient(kube.KubeConnection(server=kube_api.url), backoff=0.01)
    try:
        yield c
    finally:
        await c.close()


def configmaps(kube_api: KubeApi) -> dict[str, dict[str, str]]:
    body = kube_api.client.request("GET", resource_path("v1", "configmaps", "default")).body
    return {o["metadata"]["name"]: o.get("data") or {} for o in body["items"]}


def shard_reads(kube_api: KubeApi) -> list[object]:
    """The GETs of tenant shards the emulator served."""
    return [
        r
        for r in kube_api.call(lambda e: list(e._requests))
        if r.method == "GET" and (r.name or "").startswith("kvpool-admission-tenants-")
    ]


def test_the_emulator_refuses_a_configmap_over_1_mib_as_an_api_server_does(
    kube_api: KubeApi,
) -> None:
    # Given the single document of 5,000 tenants (what the operator used to publish)
    config = many_tenants(5000)
    text = config.to_json()
    assert len(text) > 1024 * 1024, f"5,000 tenants make {len(text)} bytes"
    single = m.build_admission_configmap("default", text, config_hash(config))
    # When it is created, then the emulator answers 422 Too long (it stored it before)
    with pytest.raises(KubeApiError) as refused:
        kube_api.client.create(resource_path("v1", "configmaps", "default"), single)
    assert refused.value.status == 422, f"{len(text)} bytes accepted: {refused.value}"
    assert "Too long: may not be more than 1048576 bytes" in refused.value.body["message"]
    assert "kvpool-admission" not in configmaps(kube_api)


@pytest.mark.timeout(120)
async def test_10000_tenants_publish_as_shards_under_900_kib_and_the_gateway_assembles_them(
    kube_api: KubeApi, client: kube.KubeClient
) -> None:
    config = many_tenants(10_000)
    action, verdict = await apply_admission_config(client, "default", config)
    assert action == "created"
    stored = configmaps(kube_api)
    sizes = {name: data_bytes(data) for name, data in stored.items()}
    assert max(sizes.values()) < NEAR_LIMIT, f"object sizes: {sizes}"
    assert verdict.verdict == "ok" and verdict.largest_bytes == max(sizes.values())
    assert len(stored) > 2, f"10,000 tenants in {sorted(stored)}"

    # the gateway assembles exactly the compiled config
    source = ConfigMapSource("default", KubeAccess(server=kube_api.url), interval=0.05)
    loaded = await source.load()
    assert config_hash(loaded) == config_hash(config)
    assert loaded.tenants == config.tenants

    # a changed tenant rewrites one shard; the shard no index names is deleted
    changed = config.model_copy(
        update={
            "tenants": [*config.tenants[:-1], config.tenants[-1].model_copy(update={"weight": 5})]
        }
    )
    action, _ = await apply_admission_config(client, "default", changed)
    assert action == "updated"
    after = configmaps(kube_api)
    assert len(set(after) - set(stored)) == 1 and len(set(stored) - set(after)) == 1
    again = await ConfigMapSource("default", KubeAccess(server=kube_api.url)).load()
    assert again.tenants[-1].weight == 5 and config_hash(again) == config_hash(changed)

    # shrinking back to a few tenants publishes one document and removes every shard
    small = standard_admission_config(["http://127.0.0.1:1"]).obj()
    await apply_admission_config(client, "default", small)
    assert sorted(configmaps(kube_api)) == [CONFIGMAP_NAME]
    assert (await ConfigMapSource("default", KubeAccess(server=kube_api.url)).load()) == small


async def test_a_publish_with_an_index_over_the_limit_is_refused_before_writing(
    kube_api: KubeApi, client: kube.KubeClient
) -> None:
    # pools and policies stay in the index: 20,000 endpoints cannot be sharded away
    config = many_tenants(10, endpoints=20000)
    with pytest.raises(ConfigTooLargeError, match=r"kvpool-admission: \d+ bytes, over the"):
        await apply_admission_config(client, "default", config)
    assert configmaps(kube_api) == {}


@pytest.mark.timeout(120)
async def test_unchanged_polls_of_10000_tenants_leave_the_loop_free(
    kube_api: KubeApi, client: kube.KubeClient
) -> None:
    config = many_tenants(10_000)
    await apply_admission_config(client, "default", config)
    source = ConfigMapSource("default", KubeAccess(server=kube_api.url), interval=0.05)
    await source.load()
    shards_read_before = len(shard_reads(kube_api))
    delivered: list[AdmissionConfig] = []
    errors: list[str] = []
    watcher = asyncio.create_task(source.watch(delivered.append, errors.append))
    lags: list[float] = []
    try:
        loop = asyncio.get_running_loop()
        end = time.monotonic() + 3.0
        while time.monotonic() < end:  # 1 ms sleeps: how late does the loop wake?
            asked = loop.time()
            await asyncio.sleep(0.001)
            lags.append(max(loop.time() - asked - 0.001, 0.0))
        polls = [r for r in kube_api.call(lambda e: list(e._requests)) if r.name == CONFIGMAP_NAME]
        assert len(polls) >= 20, f"{len(polls)} polls in 3 s"
        lags.sort()
        p99 = lags[int(len(lags) * 0.99)]
        assert p99 < 0.010, f"loop lag p99 {p99 * 1000:.1f} ms over {len(polls)} polls"
        assert not delivered and not errors, (delivered[:1], errors)
        # the unchanged polls read no shard
        assert len(shard_reads(kube_api)) == shards_read_before
    finally:
        watcher.cancel()

    # a change is picked up: only the new shard is read
    before = len(shard_reads(kube_api))
    await apply_admission_config(
        client, "default", config.model_copy(update={"tenants": config.tenants[:-1]})
    )
    watcher = asyncio.create_task(source.watch(delivered.append, errors.append))
    try:
        await wait_until_async(lambda: delivered, 10, "the changed config delivered")
        assert len(delivered[0].tenants) == len(config.tenants) - 1
        # the publisher's reads of the shards it checks, and one read of the new shard
        new_reads = len(shard_reads(kube_api)) - before
        assert new_reads == len(configmaps(kube_api)) - 1 + 1, new_reads
    finally:
        watcher.cancel()
