"""Thousands of tenants against the API emulator: the 1 MiB ConfigMap limit, the sharded
publish and the gateway's unchanged polls (issue 18, item 5).

Given a namespace with 5,000 or 10,000 tenants (~230 bytes of compiled config each),
when the operator publishes the config, then every object stays under 900 KiB, the
gateway's ConfigMapSource assembles exactly the compiled config, and polls of the
unchanged config leave its event loop free (lag p99 under 10 ms).
"""

from __future__ import annotations

import pytest

from kvpool.api.admission_config import AdmissionConfig
from kvpool.domain import manifests as m
from kvpool.domain.compile import config_hash
from tests.builders.compiled import AdmissionConfigBuilder, standard_admission_config
from tests.support.kube import KubeApi, KubeApiError, resource_path


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


def configmaps(kube_api: KubeApi) -> dict[str, dict[str, str]]:
    body = kube_api.client.request("GET", resource_path("v1", "configmaps", "default")).body
    return {o["metadata"]["name"]: o.get("data") or {} for o in body["items"]}


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
