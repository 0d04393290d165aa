"""What a production install needs from the chart (issue 17): secrets out of the Deployment,
extra flags and env, a way in (Ingress or Gateway API), metrics apart from the API, the
gateway in the release namespace, and refusals that say what to change.

Rendered with the Helm SDK like tests/unit/test_helm_chart.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest

from tests.unit.test_helm_chart import CHART, KUBE_VERSION, by_kind, render
from tests.unit.test_helm_chart_options import gateway_deployment, operator_deployment, pod_spec

SECRET_URL = "redis://:s3cret@redis-master.redis.svc:6379/0"


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


# --- Redis --------------------------------------------------------------------------------


def test_the_redis_url_comes_from_a_secret_and_appears_in_no_argument() -> None:
    docs = render({"gateway": {"replicas": 3, "redis": {"existingSecret": "kvpool-redis",
                                                        "existingSecretKey": "url"}}})  # fmt: skip

    container = pod_spec(gateway_deployment(docs))["containers"][0]
    assert not [a for a in container["args"] if a.startswith("--redis")]
    from_secret = {"secretKeyRef": {"name": "kvpool-redis", "key": "url"}}
    assert {"name": "KVPOOL_REDIS_URL", "valueFrom": from_secret} in container["env"]
    assert gateway_deployment(docs)["spec"]["replicas"] == 3


def test_a_redis_url_without_password_is_an_env_value_not_an_argument() -> None:
    container = pod_spec(
        gateway_deployment(render({"gateway": {"redis": {"url": "redis://redis:6379/0"}}}))
    )["containers"][0]

    assert {"name": "KVPOOL_REDIS_URL", "value": "redis://redis:6379/0"} in container["env"]
    assert not any("redis://" in a for a in container["args"])


def test_the_removed_redis_url_value_fails_naming_what_replaces_it() -> None:
    with pytest.raises(helm_python.HelmError) as error:
        render({"gateway": {"redisUrl": SECRET_URL}})

    assert "gateway.redis.existingSecret" in str(error.value)
    assert "s3cret" not in str(error.value)


# --- refusals that say what to change -----------------------------------------------------

REFUSALS = {
    "two-replicas-without-redis": (
        {"gateway": {"replicas": 2}},
        "gateway.replicas is 2 but budgets are kept in memory",
        "Set gateway.redis.existingSecret (a Secret holding the Redis URL) or "
        "gateway.redis.url, or set gateway.replicas=1",
    ),
    "secret-and-url": (
        {"gateway": {"redis": {"existingSecret": "r", "url": "redis://r:6379"}}},
        "set one of gateway.redis.existingSecret and gateway.redis.url",
        "not both",
    ),
    "grace-period": (
        {"gateway": {"terminationGracePeriodSeconds": 30}},
        "gateway.terminationGracePeriodSeconds (30) must exceed",
        "raise it to at least 36",
    ),
    "pool-namespace-not-watched": (
        {"operator": {"watchNamespace": "llm"}},
        "must equal operator.watchNamespace (llm)",
        "Set gateway.poolNamespace=llm",
    ),
    "ingress-without-hosts": (
        {"gateway": {"ingress": {"enabled": True, "hosts": []}}},
        "gateway.ingress.enabled needs at least one entry in gateway.ingress.hosts",
        "",
    ),
    "route-without-parent": (
        {"gateway": {"httpRoute": {"enabled": True}}},
        "gateway.httpRoute.enabled needs gateway.httpRoute.parentRefs",
        "e.g. [{name: public",
    ),
    "test-model-without-key": (
        {"helmTest": {"model": "tiny"}},
        "helmTest.model needs helmTest.apiKeySecret.name and helmTest.apiKeySecret.key",
        "in the release namespace",
    ),
}


@pytest.mark.parametrize(("values", "what", "change"), REFUSALS.values(), ids=REFUSALS.keys())
def test_a_refusal_says_what_is_wrong_and_what_to_change(
    values: dict[str, Any], what: str, change: str
) -> None:
    with pytest.raises(helm_python.HelmError) as error:
        render(values)

    assert what in str(error.value)
    assert change in str(error.value)


# --- extra flags and env ------------------------------------------------------------------


@pytest.mark.parametrize("component", ["operator", "gateway"])
def test_extra_args_and_env_reach_the_container(component: str) -> None:
    extra = {"extraArgs": ["--log-level=DEBUG"], "extraEnv": [
        {"name": "TZ", "value": "UTC"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "k"}}},
    ]}  # fmt: skip
    docs = render({component: extra})
    deployment = gateway_deployment(docs) if component == "gateway" else operator_deployment(docs)

    container = pod_spec(deployment)["containers"][0]
    assert container["args"][-1] == "--log-level=DEBUG"
    assert container["env"][-2:] == extra["extraEnv"]
    kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


def test_extra_args_must_be_flags() -> None:
    with pytest.raises(helm_python.HelmError, match="extraArgs"):
        render({"gateway": {"extraArgs": ["log-level=DEBUG"]}})


# --- the way in -----------------------------------------------------------------------------


def test_no_ingress_and_no_route_by_default() -> None:
    docs = render()

    assert by_kind(docs, "Ingress") == [] and by_kind(docs, "HTTPRoute") == []


def test_the_ingress_routes_the_api_paths_to_the_api_service() -> None:
    docs = render({"gateway": {"ingress": {
        "enabled": True, "className": "nginx",
        "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "600"},
        "hosts": [{"host": "llm.example.com", "paths": [{"path": "/v1"}]}],
        "tls": [{"hosts": ["llm.example.com"], "secretName": "llm-tls"}],
    }}})  # fmt: skip

    ingress = named(docs, "Ingress", "kvpool-gateway")
    kubernetes_validate.validate(ingress, KUBE_VERSION, strict=True)
    assert ingress["metadata"]["namespace"] == "kvpool-system"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    assert rule["http"]["paths"] == [{"path": "/v1", "pathType": "Prefix", "backend": {
        "service": {"name": "kvpool-gateway", "port": {"name": "http"}}}}]  # fmt: skip
    assert ingress["spec"]["tls"] == [{"hosts": ["llm.example.com"], "secretName": "llm-tls"}]


def test_the_http_route_attaches_to_its_gateway_and_targets_the_api_port() -> None:
    docs = render({"gateway": {"service": {"port": 8000}, "httpRoute": {
        "enabled": True, "parentRefs": [{"name": "public", "namespace": "gateway-system"}],
        "hostnames": ["llm.example.com"],
    }}})  # fmt: skip

    route = named(docs, "HTTPRoute", "kvpool-gateway")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gateway-system"}]
    assert route["spec"]["hostnames"] == ["llm.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["backendRefs"] == [{"name": "kvpool-gateway", "port": 8000}]


# --- metrics apart from the API -------------------------------------------------------------


def test_the_api_service_exposes_only_the_api_and_prometheus_scrapes_the_metrics_service() -> None:
    docs = render({"serviceMonitor": {"enabled": True}})

    api = named(docs, "Service", "kvpool-gateway")
    metrics = named(docs, "Service", "kvpool-gateway-metrics")
    assert [p["name"] for p in api["spec"]["ports"]] == ["http"]
    assert [p["name"] for p in metrics["spec"]["ports"]] == ["metrics"]
    assert metrics["spec"]["type"] == "ClusterIP"
    monitor = named(docs, "ServiceMonitor", "kvpool-gateway")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics["metadata"]["labels"].items()
    assert not selector.items() <= api["metadata"]["labels"].items()


# --- namespaces -----------------------------------------------------------------------------


def test_with_a_pool_namespace_the_gateway_stays_in_the_release_namespace() -> None:
    docs = render({"gateway": {"poolNamespace": "llm"}, "serviceMonitor": {"enabled": True},
                   "networkPolicy": {"enabled": True}})  # fmt: skip

    gateway_objects = [
        d for d in docs
        if d["metadata"]["name"].startswith(("kvpool-gateway", "kvpool-test-gateway"))
    ]  # fmt: skip
    by_namespace = {(d["kind"], d["metadata"].get("namespace")) for d in gateway_objects}
    assert by_namespace == {
        ("Deployment", "kvpool-system"),
        ("ServiceAccount", "kvpool-system"),
        ("Service", "kvpool-system"),
        ("PodDisruptionBudget", "kvpool-system"),
        ("ServiceMonitor", "kvpool-system"),
        ("Pod", "kvpool-system"),
        # RBAC grants the ConfigMap of namespace llm only from a Role of namespace llm
        ("Role", "llm"),
        ("RoleBinding", "llm"),
    }
    binding = named(docs, "RoleBinding", "kvpool-gateway")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kvpool-gateway", "namespace": "kvpool-system"}
    ]
    assert "--configmap=llm" in pod_spec(gateway_deployment(docs))["containers"][0]["args"]
    (pod,) = by_kind(docs, "Pod")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["GATEWAY_URL"] == "http://kvpool-gateway.kvpool-system.svc:80"
    # the engines (namespace llm) admit the gateway from the release namespace
    (policy,) = by_kind(docs, "NetworkPolicy")
    gateway_peer = policy["spec"]["ingress"][0]["from"][0]
    assert gateway_peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "kvpool-system"}
    }
    pod_labels = gateway_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert gateway_peer["podSelector"]["matchLabels"].items() <= pod_labels.items()


# --- values for users -----------------------------------------------------------------------


def test_values_comments_speak_to_users() -> None:
    text = (CHART / "values.yaml").read_text()

    assert "issue" not in text.lower() and "added by" not in text.lower()
    assert "gateway.redisUrl" not in text


def test_every_schema_property_of_the_new_values_has_a_default() -> None:
    schema = json.loads(Path(CHART / "values.schema.json").read_text())
    gateway = schema["properties"]["gateway"]["properties"]
    values = helm_python.Chart.load(CHART).values

    for key in ("redis", "extraArgs", "extraEnv", "ingress", "httpRoute"):
        assert key in gateway and key in values["gateway"], key
