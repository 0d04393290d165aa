"""The Helm chart renders valid Kubernetes objects, lints clean, and its values schema bites.

Rendering uses the Helm SDK through helm-python-sdk (no helm binary on these machines);
built-in objects are checked with kubernetes-validate in strict mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kvpool"
KUBE_VERSION = kubernetes_validate.latest_version()


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    rendered = chart.render(values or {}, name="kvpool", namespace="kvpool-system")
    return [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_chart_lints_without_errors_or_warnings() -> None:
    report = helm_python.lint(CHART, strict=True)

    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


VALUE_CASES = {
    "defaults": {},
    "namespaced-operator-no-gateway": {
        "operator": {"watchNamespace": "llm"},
        "gateway": {"enabled": False},
    },
    "redis-and-servicemonitors": {
        "gateway": {
            "replicas": 2,
            "redis": {"existingSecret": "kvpool-redis"},
            "poolNamespace": "llm",
            "ingress": {"enabled": True},
        },
        "serviceMonitor": {"enabled": True},
        "engineMonitor": {"enabled": True},
    },
}


@pytest.mark.parametrize("values", VALUE_CASES.values(), ids=VALUE_CASES.keys())
def test_rendered_builtins_validate_strictly(values: dict[str, Any]) -> None:
    docs = render(values)

    builtins = [d for d in docs if d["kind"] not in {"ServiceMonitor", "PodMonitor", "HTTPRoute"}]
    assert builtins
    for doc in builtins:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_cluster_wide_operator_gets_a_cluster_role_with_status_only_writes() -> None:
    docs = render()

    (role,) = by_kind(docs, "ClusterRole")
    kvpool_rules = [r for r in role["rules"] if r["apiGroups"] == ["kvpool.dev"]]
    spec_rule = next(r for r in kvpool_rules if "modelpools" in r["resources"])
    assert "update" not in spec_rule["verbs"]  # the operator never writes spec
    assert "create" not in spec_rule["verbs"]
    status_rule = next(r for r in kvpool_rules if "modelpools/status" in r["resources"])
    assert "patch" in status_rule["verbs"]
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "kvpool-system"


def test_namespaced_operator_gets_a_role_and_the_flag() -> None:
    docs = render(VALUE_CASES["namespaced-operator-no-gateway"])

    # the namespaced rules in a Role of the watched namespace; only cluster-scoped
    # resources in a ClusterRole; the Lease in the release namespace
    roles = {r["metadata"]["name"]: r for r in by_kind(docs, "Role")}
    assert roles["kvpool-operator"]["metadata"]["namespace"] == "llm"
    assert roles["kvpool-operator-leader-election"]["metadata"]["namespace"] == "kvpool-system"
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
    }
    (operator,) = by_kind(docs, "Deployment")
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=llm" in args


def test_gateway_reads_the_compiled_config_leases_the_plan_and_uses_redis() -> None:
    docs = render(VALUE_CASES["redis-and-servicemonitors"])

    gateway = next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("gateway")
    )
    assert gateway["metadata"]["namespace"] == "kvpool-system"  # the release's, not the pools'
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert "--configmap=llm" in container["args"]
    assert not [a for a in container["args"] if "plan-share" in a]  # leases, by demand
    assert container["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "KVPOOL_REDIS_URL",
            "valueFrom": {"secretKeyRef": {"name": "kvpool-redis", "key": "redis-url"}},
        },
    ]
    role = next(r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("gateway"))
    assert role["metadata"]["namespace"] == "llm"  # where the ConfigMap is
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["kvpool-admission"],
            "verbs": ["get", "watch"],
        },
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},  # tenant shards
    ]
    assert len(by_kind(docs, "ServiceMonitor")) == 2


def test_engine_pod_monitor_relabels_what_the_operator_queries() -> None:
    docs = render(VALUE_CASES["redis-and-servicemonitors"])

    (monitor,) = by_kind(docs, "PodMonitor")
    relabelings = monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
    targets = {r["targetLabel"] for r in relabelings}
    # the labels kvpool.adapters.prometheus selects and groups engine series by
    assert {"kvpool_pool", "kvpool_revision", "kvpool_track", "namespace", "pod"} <= targets
    assert by_kind(render(), "PodMonitor") == []


def test_network_policy_lets_only_the_gateway_and_prometheus_reach_engines() -> None:
    assert by_kind(render(), "NetworkPolicy") == []
    docs = render({"networkPolicy": {"enabled": True}, "gateway": {"poolNamespace": "llm"}})

    (policy,) = by_kind(docs, "NetworkPolicy")
    kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
    assert policy["metadata"]["namespace"] == "llm"
    assert policy["spec"]["podSelector"]["matchExpressions"] == [
        {"key": "kvpool.dev/pool", "operator": "Exists"}
    ]
    gateway, prometheus = policy["spec"]["ingress"][0]["from"]
    gateway_pods = next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("gateway")
    )["spec"]["template"]["metadata"]["labels"]
    assert gateway["podSelector"]["matchLabels"].items() <= gateway_pods.items()
    assert prometheus["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }


BAD_VALUES = {
    "unknown-top-level-key": {"gatewy": {}},
    "zero-operator-replicas": {"operator": {"replicas": 0}},
    "prometheus-url-without-scheme": {"operator": {"prometheusUrl": "prometheus:9090"}},
    "redis-url-not-redis": {"gateway": {"redis": {"url": "http://redis:6379"}}},
    "two-gateways-without-redis": {"gateway": {"replicas": 2}},
    "bad-pull-policy": {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
    "network-policy-unknown-key": {"networkPolicy": {"enabled": True, "egress": []}},
}


@pytest.mark.parametrize("values", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_values_schema_rejects(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError):
        render(values)


def test_chart_ships_the_generated_crds() -> None:
    generated = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))

    assert generated, "crds/ is empty: run make crds"
    for name in generated:
        shipped = CHART / "crds" / name
        assert shipped.exists(), f"charts/kvpool/crds/{name} missing: run make crds"
        assert shipped.read_text() == (ROOT / "crds" / name).read_text(), "run make crds"
