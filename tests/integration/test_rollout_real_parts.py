"""Canary rollouts with real parts: vLLM CPU engines, a real Prometheus, the API emulator,
the operator and the gateway as processes.

Given a pool whose stable engine has 2 MiB of KV (2,048 tokens of the tiny model) and a
canary engine with 1 MiB (1,024 tokens), both scraped by Prometheus with the labels a
cluster's relabeling gives (namespace, kvpool_pool, kvpool_revision, pod):

- the rollout pauses with ``KVCapacityShrunk`` within one measurement interval (15 s)
  of the canary being measurable, before the canary gets any weight;
- batch traffic through the gateway never reaches the canary, also once a human resumes
  past the shortfall (interactive traffic then does reach it: the routing is live);
- abort (through the kubectl plugin) restores stable-only routing.

And given a canary with the same KV as stable, with traffic on both tracks, a healthy
canary is promoted through every step: every tier on the canary, stable drained (no
request running on it), then replaced by the new revision.

Local mode: ``kvpool.dev/static-endpoints`` / ``kvpool.dev/canary-static-endpoints`` give
the gateway the engines' URLs (there are no pods).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import (
    apikey_secret_manifest,
    modelpool_manifest,
    tenantbudget_manifest,
    tierpolicy_manifest,
)
from tests.integration.test_operator import admission_config, core, mp, names, status, tb, tp
from tests.integration.test_operator_rollout import kubectl_kvpool
from tests.operator_process import run_operator
from tests.support.engine import VllmEngine
from tests.support.gateway import GatewayProcess, GatewayProcesses
from tests.support.kube import KubeApi
from tests.support.prometheus import PrometheusFactory, ScrapeTarget
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.prometheus]

API_KEY = "sk-rollout-1"
MEASUREMENT_INTERVAL = 15.0  # the operator's default --measure-interval


def given_policy_tenant_and_pool(kube: KubeApi, stable_url: str, rollout: dict[str, Any]) -> None:
    """interactive (Host chat.local) 50% / batch (everything else) 40%, a tenant, a pool."""
    kube.client.create(core("secrets"), apikey_secret_manifest("acme-key", "api-key", API_KEY))
    kube.client.create(
        tb(),
        tenantbudget_manifest("acme").tiers("interactive", "batch").limit("1h", 10_000_000).dict(),
    )
    policy = (
        tierpolicy_manifest()
        .tier("interactive", floor=50, lend=100, max_wait="20s")
        .tier("batch", floor=40, lend=50, max_wait="60s")
        .rule("interactive", host="chat.local")
    )
    kube.client.create(tp(), policy.dict())
    pool = (
        modelpool_manifest("chat")
        .lengths((50, 100), (16, 32))
        .engine(maxNumSeqs=8, maxModelLen=512)
        .replicas(1, 1)
        .dict()
    )
    pool["spec"]["model"]["servedName"] = "tiny"
    pool["spec"]["rollout"] = rollout
    pool["metadata"]["annotations"] = {"kvpool.dev/static-endpoints": f"s1={stable_url}"}
    kube.client.create(mp(), pool)


def scrape(engine: VllmEngine, revision: str, pod: str) -> ScrapeTarget:
    labels = {"namespace": "default", "kvpool_pool": "chat", "kvpool_revision": revision}
    track = "stable" if pod.startswith("chat-stable") else "canary"
    return ScrapeTarget(engine.target, {**labels, "pod": pod, "kvpool_track": track})


def finished(engine: VllmEngine) -> float:
    """Requests the engine finished (vllm:e2e_request_latency_seconds count)."""
    total = 0.0
    for family in text_string_to_metric_families(engine.fetch_metrics_text()):
        for sample in family.samples:
            if sample.name == "vllm:e2e_request_latency_seconds_count":
                total += sample.value
    return total


def rollout(kube: KubeApi) -> dict[str, Any]:
    return status(kube).get("rollout") or {}


def phase(kube: KubeApi) -> tuple[Any, Any, Any]:
    r = rollout(kube)
    return r.get("phase"), r.get("stage"), r.get("reason")


def tracks(kube: KubeApi) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in admission_config(kube)["pools"][0]["tracks"]}


def complete(gateway: str, host: str, tokens: int = 16) -> int:
    """One completion through the gateway; returns the HTTP status."""
    body = {"model": "tiny", "prompt": "hello " * 20, "max_tokens": tokens, "temperature": 0}
    request = urllib.request.Request(
        f"{gateway}/v1/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {API_KEY}",
            "Host": host,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def warm_up(engine: VllmEngine, count: int = 12, parallel: int = 4) -> None:
    """Send an engine directly the requests ``send`` makes, at the same concurrency."""
    body = {"model": "tiny", "prompt": "hello " * 20, "max_tokens": 16, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda _: engine.post_json("/v1/completions", body), range(count)))


def send(gateway: str, host: str, count: int, parallel: int = 4) -> list[int]:
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(lambda _: complete(gateway, host), range(count)))


@pytest.fixture
def gateway(kube_api: KubeApi, gateway_process: GatewayProcesses) -> Callable[[], GatewayProcess]:
    """Factory: ``kvpool gateway`` reading the operator's ConfigMap from the emulator (start
    it once the operator wrote the ConfigMap); stopped after the test."""
    return lambda: gateway_process(
        configmap=("default", kube_api.url), extra_args=("--no-access-log",)
    )


def reloaded(gateway: GatewayProcess, kube: KubeApi) -> bool:
    """The gateway has applied the admission config the operator publishes now."""
    return gateway.config_generated_at() == admission_config(kube)["generatedAt"]


@pytest.fixture(scope="module")
def engines(vllm_engine_module: Any) -> dict[str, VllmEngine]:
    """Engines started one after another: stable 2 MiB; canaries of 1 MiB, of 2 MiB, and of
    2 MiB with --max-num-seqs 1 (same KV, slower under concurrent load)."""
    return {
        "stable": vllm_engine_module(kv_cache_memory_bytes=2 * 2**20, block_size=32),
        "half": vllm_engine_module(kv_cache_memory_bytes=2**20, block_size=32),
        "equal": vllm_engine_module(kv_cache_memory_bytes=2 * 2**20, block_size=32),
        "slow": vllm_engine_module(kv_cache_memory_bytes=2 * 2**20, block_size=32, max_num_seqs=1),
    }


def assert_kv_gate_exported(metrics: str, stable: int, canary: int, phase: str) -> None:
    """The operator's gauges carry both tracks' KV figures and the rollout phase."""
    for track, value in (("stable", stable), ("canary", canary)):
        series = (
            f'kvpool_rollout_gate_value{{gate="kvCapacity",namespace="default",'
            f'pool="chat",track="{track}"}} {value:.1f}'
        )
        assert series in metrics, f"{series} not in the operator's metrics"
    assert f'kvpool_rollout_phase{{namespace="default",phase="{phase}",pool="chat"}} 1.0' in (
        metrics
    )


def test_half_kv_canary_pauses_at_once_and_batch_never_reaches_it(
    kube_api: KubeApi,
    engines: dict[str, VllmEngine],
    gateway: Callable[[], GatewayProcess],
    tmp_path: Path,
    prometheus_server: PrometheusFactory,
) -> None:
    stable, canary = engines["stable"], engines["half"]
    prom = prometheus_server()
    with run_operator(kube_api, tmp_path, prometheus_url=prom.url, interval="15s") as op:
        # Given a pool measured on its stable engine (2,048 tokens)
        rollout_spec = {"steps": [{"weight": 50, "pause": "10m"}], "canaryTiers": []}
        given_policy_tenant_and_pool(kube_api, stable.base_url, rollout_spec)
        first = wait_until(lambda: status(kube_api).get("revision"))
        prom.set_targets({"vllm": [scrape(stable, first, "chat-stable-0")]})
        wait_until(lambda: status(kube_api)["capacity"]["kvTokensPerReplica"] == 2048, timeout=60)
        # When the engine changes (half the KV cache) and its canary comes up
        kube_api.client.patch(
            mp("chat"),
            {
                "metadata": {
                    "annotations": {"kvpool.dev/canary-static-endpoints": canary.base_url}
                },
                "spec": {"engine": {"args": ["--kv-cache-memory-bytes=1048576"]}},
            },
        )
        wait_until(lambda: phase(kube_api) == ("Progressing", "Starting", None))
        new = rollout(kube_api)["canaryRevision"]
        # the status is written before the config that carries the canary is published
        wait_until(lambda: "canary" in tracks(kube_api), 30, "the canary track published")
        assert tracks(kube_api)["canary"]["weight"] == 0
        prom.set_targets(
            {"vllm": [scrape(stable, first, "chat-stable-0"), scrape(canary, new, "c-0")]}
        )
        prom.wait_for(
            f'vllm:cache_config_info{{kvpool_revision="{new}"}}', timeout=30, interval=0.2
        )
        measurable = time.monotonic()
        # Then it pauses with KVCapacityShrunk within one measurement interval
        wait_until(lambda: phase(kube_api)[0] == "Paused", timeout=60, interval=0.2)
        reaction = time.monotonic() - measurable
        assert phase(kube_api) == ("Paused", "Starting", "KVCapacityShrunk")
        assert reaction < MEASUREMENT_INTERVAL, reaction
        message = rollout(kube_api)["message"]
        assert "1024" in message and "2048" in message and "0.50" in message
        kv_gate = rollout(kube_api)["gates"][0]
        assert (kv_gate["stable"], kv_gate["canary"], kv_gate["verdict"]) == (
            2048,
            1024,
            "Failed",
        )
        assert tracks(kube_api)["canary"]["weight"] == 0
        assert rollout(kube_api)["canaryPlan"]["usableKvTokensPerReplica"] == 921
        assert_kv_gate_exported(op.metrics(), stable=2048, canary=1024, phase="Paused")

        # Batch traffic through the gateway never reaches the canary...
        gw = gateway()
        url = gw.url
        before = finished(canary)
        assert set(send(url, "batch.local", 12)) == {200}
        assert finished(canary) == before

        # ...also after a human resumes past the shortfall (interactive does reach it)
        kubectl_kvpool(kube_api, tmp_path, "rollout", "resume", "chat")
        wait_until(lambda: tracks(kube_api)["canary"]["weight"] == 50, timeout=30)
        assert admission_config(kube_api)["pools"][0]["canaryTiers"] == ["interactive"]
        wait_until(lambda: reloaded(gw, kube_api), 10, "the gateway reloading the config")
        before = finished(canary)
        assert set(send(url, "batch.local", 16)) == {200}
        assert finished(canary) == before
        assert set(send(url, "chat.local", 16)) == {200}
        assert finished(canary) > before

        # When aborted through the plugin: stable-only routing again
        kubectl_kvpool(kube_api, tmp_path, "rollout", "abort", "chat")
        wait_until(lambda: phase(kube_api)[0] == "Aborted", timeout=30)
        wait_until(lambda: tracks(kube_api)["canary"]["endpoints"] == [], timeout=30)
        wait_until(lambda: reloaded(gw, kube_api), 10, "the gateway reloading the config")
        before = finished(canary)
        assert set(send(url, "chat.local", 12)) == {200}
        assert finished(canary) == before
        assert (
            kube_api.client.get(core("deployments", "chat-canary", api="apps/v1"))["spec"][
                "replicas"
            ]
            == 0
        )


def test_a_healthy_canary_is_promoted_through_every_step(
    kube_api: KubeApi,
    engines: dict[str, VllmEngine],
    gateway: Callable[[], GatewayProcess],
    tmp_path: Path,
    prometheus_server: PrometheusFactory,
) -> None:
    stable, canary = engines["stable"], engines["equal"]
    prom = prometheus_server()
    with run_operator(kube_api, tmp_path, prometheus_url=prom.url, interval="2s") as op:
        rollout_spec = {
            # long enough for minSamples on the canary at 30% even with the restart below
            "steps": [{"weight": 30, "pause": "20s"}, {"weight": 60, "pause": "15s"}],
            "gates": {"minSamples": 5, "maxTTFTP95Ratio": 5.0},
            "analysisInterval": "2s",
            # a handful of samples on two shared cores is noisy: an analysis every 2 s
            # may see one bad window; a real regression fails every one
            "failureLimit": 3,
            "drainTimeout": "60s",
        }
        given_policy_tenant_and_pool(kube_api, stable.base_url, rollout_spec)
        first = wait_until(lambda: status(kube_api).get("revision"))
        prom.set_targets({"vllm": [scrape(stable, first, "chat-stable-0")]})
        wait_until(lambda: status(kube_api)["capacity"]["kvTokensPerReplica"] == 2048, timeout=60)
        # a fresh engine's first requests of each shape are slow (warm-up): with a
        # handful of samples that alone reads as a 5x TTFT regression (seen twice with
        # 3 tiny warm-up prompts), so the canary is warmed with the traffic it will get
        warm_up(canary)
        kube_api.client.patch(
            mp("chat"),
            {
                "metadata": {
                    "annotations": {"kvpool.dev/canary-static-endpoints": canary.base_url}
                },
                "spec": {"model": {"version": "v2"}},
            },
        )
        wait_until(lambda: rollout(kube_api).get("canaryRevision"))
        new = rollout(kube_api)["canaryRevision"]
        prom.set_targets(
            {"vllm": [scrape(stable, first, "chat-stable-0"), scrape(canary, new, "c-0")]}
        )
        gw = gateway()
        url = gw.url
        seen_steps: set[int] = set()
        killed_at: dict[str, Any] | None = None
        deadline = time.monotonic() + 150
        # interactive traffic keeps both tracks measured until promotion
        while phase(kube_api)[1] in ("Starting", "Analyzing") and time.monotonic() < deadline:
            current = rollout(kube_api)
            assert current["phase"] == "Progressing", (
                current.get("reason"),
                current.get("message"),
                current.get("gates"),
            )
            if phase(kube_api)[1] == "Analyzing":
                seen_steps.add(rollout(kube_api)["step"])
                if killed_at is None:
                    # the operator is killed mid-step and restarted: it resumes from status
                    killed_at = rollout(kube_api)
                    op.restart(kill=True)
                    assert rollout(kube_api)["step"] == killed_at["step"]
                    assert names(kube_api, "deployments", "apps/v1") == [
                        "chat-canary",
                        "chat-stable",
                    ]
            send(url, "chat.local", 8)
        assert seen_steps == {0, 1}, rollout(kube_api)
        assert killed_at is not None and killed_at["step"] == 0
        wait_until(lambda: phase(kube_api)[0] == "Promoted", timeout=90)
        assert rollout(kube_api)["stableRevision"] == new
        messages = _event_messages(kube_api)
        assert any("drained: replacing" in m for m in messages), messages
        assert any("draining the canary" in m for m in messages), messages
        wait_until(lambda: names(kube_api, "deployments", "apps/v1") == ["chat-stable"])
        dep = kube_api.client.get(core("deployments", "chat-stable", api="apps/v1"))
        assert dep["metadata"]["labels"]["kvpool.dev/revision"] == new
        wait_until(lambda: set(tracks(kube_api)) == {"stable"})


def test_a_slower_canary_fails_the_ttft_gate_and_is_aborted(
    kube_api: KubeApi,
    engines: dict[str, VllmEngine],
    gateway: Callable[[], GatewayProcess],
    tmp_path: Path,
    prometheus_server: PrometheusFactory,
) -> None:
    stable, canary = engines["stable"], engines["slow"]
    prom = prometheus_server()
    with run_operator(kube_api, tmp_path, prometheus_url=prom.url, interval="2s"):
        rollout_spec = {
            "steps": [{"weight": 50, "pause": "10m"}],
            "gates": {"minSamples": 8, "maxTTFTP95Ratio": 1.5},
            "onFailure": "Abort",
            "analysisInterval": "3s",
        }
        given_policy_tenant_and_pool(kube_api, stable.base_url, rollout_spec)
        first = wait_until(lambda: status(kube_api).get("revision"))
        prom.set_targets({"vllm": [scrape(stable, first, "chat-stable-0")]})
        wait_until(lambda: status(kube_api)["capacity"]["kvTokensPerReplica"] == 2048, timeout=60)
        # When the canary (same KV, one sequence at a time) takes half the interactive load
        kube_api.client.patch(
            mp("chat"),
            {
                "metadata": {
                    "annotations": {"kvpool.dev/canary-static-endpoints": canary.base_url}
                },
                # a new engine image whose spec says nothing of its slowness (the
                # canary engine runs one sequence at a time): the gateway admits on
                # the canary's plan as on stable's, and the engine's TTFT shows it
                "spec": {"engine": {"image": "vllm/vllm-openai:slower"}},
            },
        )
        new = wait_until(lambda: rollout(kube_api).get("canaryRevision"))
        prom.set_targets(
            {"vllm": [scrape(stable, first, "chat-stable-0"), scrape(canary, new, "c-0")]}
        )
        wait_until(lambda: phase(kube_api) == ("Progressing", "Analyzing", None), timeout=30)
        gw = gateway()
        url = gw.url
        deadline = time.monotonic() + 120
        while phase(kube_api)[0] == "Progressing" and time.monotonic() < deadline:
            send(url, "chat.local", 16, parallel=8)
        # Then the TTFT gate fails with enough samples on both tracks, and it aborts
        assert phase(kube_api) == ("Aborted", "Analyzing", "TTFTRegressed"), rollout(kube_api)
        ttft = next(g for g in rollout(kube_api)["gates"] if g["gate"] == "ttftP95")
        assert ttft["verdict"] == "Failed" and ttft["ratio"] > 1.5
        assert ttft["stableSamples"] >= 8 and ttft["canarySamples"] >= 8
        assert ttft["canary"] > ttft["stable"]
        wait_until(
            lambda: (
                kube_api.client.get(core("deployments", "chat-canary", api="apps/v1"))["spec"][
                    "replicas"
                ]
                == 0
            )
        )
        wait_until(lambda: tracks(kube_api)["canary"]["weight"] == 0)


def _event_messages(kube: KubeApi) -> list[str]:
    items = kube.client.get(core("events"))["items"]
    return [e["message"] for e in items if e["involvedObject"]["name"] == "chat"]
