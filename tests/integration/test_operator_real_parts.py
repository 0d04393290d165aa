"""The operator with real parts: two vLLM engines on CPU, a real Prometheus, the emulator.

Given two engines of the tiny model with different KV caches (2 MiB = 2,048 tokens and
1 MiB = 1,024 tokens; the tiny model's KV costs 1 KiB a token) and a Prometheus scraping
them with the labels a cluster's relabeling would give (namespace, kvpool_pool,
kvpool_revision, pod), the operator must plan with the *measured* figure, not the declared
100,000, follow the measurement when it changes, plan with the minimum when replicas
disagree, and keep its plan (MetricsUnavailable) when Prometheus goes away.

Numbers: p95 200 + 100 = 300 tokens a sequence, target 90%:
2,048 -> 1,843 usable -> 6 live sequences; 1,024 -> 921 usable -> 3 live sequences.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_operator import condition, events, given_policy_tenant_and_pool, status
from tests.operator_process import run_operator
from tests.support.engine import VllmEngine
from tests.support.kube import KubeApi
from tests.support.prometheus import PrometheusFactory, ScrapeTarget
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.prometheus]


def _engine(address: str, revision: str, pod: str) -> dict[str, list[str | ScrapeTarget]]:
    """The scrape job of one engine pod, labelled as in-cluster relabeling would."""
    labels = {"namespace": "default", "kvpool_pool": "chat", "kvpool_revision": revision}
    return {"vllm": [ScrapeTarget(address, {**labels, "pod": pod})]}


def _capacity(kube: KubeApi) -> tuple[Any, Any, Any]:
    st = status(kube)
    return (
        st["capacity"]["source"],
        st["capacity"]["kvTokensPerReplica"],
        st["plan"]["usableKvTokensPerReplica"],
    )


def test_operator_plans_with_measured_capacity_and_keeps_it_when_prometheus_goes(
    kube_api: KubeApi, vllm_engine: Any, tmp_path: Path, prometheus_server: PrometheusFactory
) -> None:
    big: VllmEngine = vllm_engine(kv_cache_memory_bytes=2 * 2**20, block_size=32)
    small: VllmEngine = vllm_engine(kv_cache_memory_bytes=2**20, block_size=32)
    assert (
        big.fetch_cache_config().capacity_tokens,
        small.fetch_cache_config().capacity_tokens,
    ) == (2048, 1024)

    prom = prometheus_server()
    with run_operator(kube_api, tmp_path, prometheus_url=prom.url) as operator:
        # Given a pool declaring 100,000 tokens, planned with the declared figure at first
        given_policy_tenant_and_pool(kube_api)
        kube_api.client.patch(
            "/apis/kvpool.dev/v1alpha1/namespaces/default/modelpools/chat",
            {
                "spec": {
                    "capacity": {"kvTokensPerReplica": 100_000},
                    "engine": {"maxNumSeqs": 8},
                }
            },
        )
        wait_until(lambda: _capacity(kube_api) == ("Declared", 100_000, 90_000))
        # the revision stable runs (the engine patch above may have started a rollout)
        revision = status(kube_api)["rollout"]["stableRevision"]

        # When Prometheus scrapes the big engine as this pool's revision
        prom.set_targets(_engine(big.target, revision, "chat-a"))
        # Then the plan uses the measured 2,048 tokens
        wait_until(lambda: _capacity(kube_api) == ("Measured", 2048, 1843), timeout=60)
        st = status(kube_api)
        assert st["plan"]["liveSequencesPerReplica"] == 6
        assert st["capacity"]["blockSize"] == 32 and st["capacity"]["revision"] == revision
        assert condition(st, "CapacityMeasured") == ("True", "Measured")
        assert condition(st, "MetricsUnavailable") == ("False", "MetricsFresh")
        assert st["load"]["running"] == 0

        # When a second replica of the revision reports half of it: plan with the minimum
        both = _engine(big.target, revision, "chat-a")["vllm"]
        both += _engine(small.target, revision, "chat-b")["vllm"]
        prom.set_targets({"vllm": both})
        # both at once: a late scrape can leave one engine's series stale for a moment
        wait_until(
            lambda: (
                _capacity(kube_api) == ("Measured", 1024, 921)
                and condition(status(kube_api), "Degraded") == ("True", "ReplicasDisagree")
            ),
            timeout=60,
        )
        assert status(kube_api)["plan"]["liveSequencesPerReplica"] == 3
        assert "MeasurementChanged" in wait_until(lambda: events(kube_api))

        # When only the small one remains, the replicas agree again
        prom.set_targets(_engine(small.target, revision, "chat-b"))
        wait_until(
            lambda: condition(status(kube_api), "Degraded") == ("False", "AsExpected"),
            timeout=60,
        )
        assert _capacity(kube_api) == ("Measured", 1024, 921)
        plan_before = status(kube_api)["plan"]
        warm_before = status(kube_api)["replicas"]["desired"]

        # When Prometheus goes away
        prom.stop()
        # Then MetricsUnavailable, and the plan and warm replicas are kept
        wait_until(
            lambda: (
                condition(status(kube_api), "MetricsUnavailable")
                == ("True", "PrometheusUnreachable")
            ),
            timeout=30,
        )
        st = status(kube_api)
        assert st["plan"] == plan_before
        assert st["replicas"]["desired"] == warm_before
        assert condition(st, "CapacityMeasured") == ("True", "KeptLastMeasurement")
        assert st["capacity"]["kvTokensPerReplica"] == 1024
        config = json.loads(
            kube_api.client.get("/api/v1/namespaces/default/configmaps/kvpool-admission")["data"][
                "config.json"
            ]
        )
        assert config["pools"][0]["tokensPerReplica"] == 921 and config["pools"][0]["planOk"]
        assert "kvpool_operator_measurement_age_seconds" in operator.metrics()
