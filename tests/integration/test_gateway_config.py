"""The gateway picks up a new compiled config - from a file or the operator's ConfigMap -
without a restart and without dropping in-flight requests; a broken config is ignored.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp
import pytest

from kvpool.adapters.config_source import (
    ConfigError,
    ConfigMapSource,
    FileConfigSource,
    KubeAccess,
    fetch_config_file,
)
from kvpool.api.admission_config import CONFIGMAP_KEY, CONFIGMAP_NAME, AdmissionConfig
from tests.builders import standard_admission_config
from tests.support.gateway import FakeEngine, GatewayProcesses
from tests.support.kube import KubeApi
from tests.support.waiting import wait_until_async


def configmap_reads(kube: KubeApi) -> list[object]:
    """The GETs of the admission ConfigMap the emulator served (the source's polls)."""
    return [
        r
        for r in kube.call(lambda e: list(e._requests))
        if r.resource is not None
        and r.resource.plural == "configmaps"
        and r.name == CONFIGMAP_NAME
        and str(r.method.value) == "GET"
    ]


async def _next_config(queue: asyncio.Queue[AdmissionConfig]) -> AdmissionConfig:
    return await asyncio.wait_for(queue.get(), timeout=5)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("{not json", "Invalid JSON"),
        ('{"formatVersion": 2, "namespace": "x"}', "formatVersion"),
        ('{"namespace": "x", "surprise": 1}', "surprise"),
    ],
    ids=["bad-json", "unknown-format-version", "unknown-field"],
)
def test_a_config_that_breaks_the_contract_is_refused(
    tmp_path: Path, content: str, fragment: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=fragment):
        fetch_config_file(path)


async def test_file_source_reloads_on_change_and_keeps_the_last_good(tmp_path: Path) -> None:
    path = standard_admission_config(["http://127.0.0.1:1"]).write(tmp_path / "config.json")
    source = FileConfigSource(path, interval=0.02)
    assert source.load().tenants[0].tenant == "acme"
    configs: asyncio.Queue[AdmissionConfig] = asyncio.Queue()
    errors: list[str] = []
    watcher = asyncio.create_task(source.watch(configs.put_nowait, errors.append))
    try:
        changed = standard_admission_config(["http://127.0.0.1:1"])
        changed.tenant("newcomer", key="sk-new", tiers=["batch"])
        changed.write(path)
        assert len((await _next_config(configs)).tenants) == 3

        path.write_text("{broken")
        await wait_until_async(lambda: errors, 5, "the broken file reported")
        assert configs.empty()

        # a ConfigMap volume update: a new file swapped in by a symlink rename
        target = standard_admission_config(["http://127.0.0.1:2"]).write(tmp_path / "v2.json")
        link = tmp_path / "link.tmp"
        link.symlink_to(target)
        os.replace(link, path)
        config = await _next_config(configs)
        assert config.pools[0].tracks[0].endpoints[0].url == "http://127.0.0.1:2"
    finally:
        watcher.cancel()


async def test_configmap_source_follows_the_operator_configmap(kube_api: KubeApi) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    first = standard_admission_config(["http://127.0.0.1:1"]).obj()
    kube_api.client.create(
        path,
        {"metadata": {"name": CONFIGMAP_NAME}, "data": {CONFIGMAP_KEY: first.to_json()}},
    )
    source = ConfigMapSource("default", KubeAccess(server=kube_api.url), interval=0.05)
    assert (await source.load()).tenants[0].tenant == "acme"
    configs: asyncio.Queue[AdmissionConfig] = asyncio.Queue()
    errors: list[str] = []
    watcher = asyncio.create_task(source.watch(configs.put_nowait, errors.append))
    try:
        # several polls of the unchanged ConfigMap (same resourceVersion) deliver nothing
        await wait_until_async(
            lambda: len(configmap_reads(kube_api)) >= 3, 5, "three polls of the ConfigMap"
        )
        assert configs.empty()
        second = standard_admission_config(["http://127.0.0.1:1"])
        second.tenant("newcomer", key="sk-new", tiers=["batch"])
        kube_api.client.patch(
            f"{path}/{CONFIGMAP_NAME}", {"data": {CONFIGMAP_KEY: second.obj().to_json()}}
        )
        assert len((await _next_config(configs)).tenants) == 3
        kube_api.client.patch(f"{path}/{CONFIGMAP_NAME}", {"data": {CONFIGMAP_KEY: "{"}})
        await wait_until_async(lambda: errors, 5, "the broken ConfigMap reported")
        assert configs.empty()
    finally:
        watcher.cancel()


async def test_running_gateway_process_reloads_without_dropping_requests(
    fake_engine: FakeEngine, gateway_process: GatewayProcesses, tmp_path: Path
) -> None:
    """Given a `kvpool gateway` process serving a slow request, when its config file gains a
    tenant, then the slow request completes and the new tenant is served."""
    fake_engine.delay = 1.5
    config_path = standard_admission_config([fake_engine.url]).write(tmp_path / "config.json")
    gateway = await gateway_process.started(config_path, extra_args=("--reload-interval", "0.1"))
    async with aiohttp.ClientSession() as session:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        slow = asyncio.ensure_future(
            session.post(
                f"{gateway.url}/v1/completions",
                json=body,
                headers={"Authorization": "Bearer sk-acme"},
            )
        )
        await wait_until_async(lambda: fake_engine.received, 5, "the slow request at the engine")
        changed = standard_admission_config([fake_engine.url])
        changed.tenant("newcomer", key="sk-new", tiers=["batch"])
        changed.write(config_path)
        fake_engine.delay = 0.0

        async def newcomer_served() -> bool:
            async with session.post(
                f"{gateway.url}/v1/completions",
                json=body,
                headers={"Authorization": "Bearer sk-new"},
            ) as resp:
                return resp.status == 200

        await wait_until_async(newcomer_served, 5, "the new tenant served after the reload")
        slow_resp = await slow
        assert slow_resp.status == 200
        assert json.loads(await slow_resp.read())["usage"]["completion_tokens"] == 2
        async with session.get(gateway.metrics_url) as resp:
            text = await resp.text()
        assert 'kvpool_gateway_config_reloads_total{result="applied"} 1.0' in text
