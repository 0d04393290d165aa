"""The chart's defaults are the safe ones, and every operations knob renders where it should.

Rendered with the Helm SDK (helm-python-sdk), like tests/unit/test_helm_chart.py. The
helm-test Pod's script is run for real against a gateway in
tests/integration/test_observability.py; here only its wiring is checked.
"""

from __future__ import annotations

import re
from typing import Any

import helm_python
import kubernetes_validate
import pytest

from tests.unit.test_helm_chart import CHART, KUBE_VERSION, by_kind, render

REDIS = "redis://redis.kvpool:6379/0"


def gateway_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("gateway"))


def operator_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"].endswith("operator")
    )


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def notes(values: dict[str, Any] | None = None, namespace: str = "kvpool-system") -> str:
    rendered = helm_python.Chart.load(CHART).render(
        values or {}, name="kvpool", namespace=namespace
    )
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


# --- defaults ------------------------------------------------------------------------------


def test_default_gateway_is_one_replica_with_memory_budgets_and_the_whole_plan() -> None:
    gateway = gateway_deployment(render())

    assert gateway["spec"]["replicas"] == 1
    container = pod_spec(gateway)["containers"][0]
    assert not any(a.startswith(("--redis", "--plan-share")) for a in container["args"])
    pod_name = {e["name"]: e for e in container["env"]}["POD_NAME"]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert not by_kind(render(), "HorizontalPodAutoscaler")


def test_several_replicas_lease_the_plan_instead_of_a_fixed_share() -> None:
    """Before: the chart baked --plan-share=100/N into the args (50 with two replicas), so
    skewed ingress got half the engines and N could not change without a new rollout."""
    gateway = gateway_deployment(render({"gateway": {"replicas": 3, "redis": {"url": REDIS}}}))
    args = pod_spec(gateway)["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--plan-share")], args


def test_autoscaling_renders_an_hpa_that_owns_the_replica_count() -> None:
    values = {
        "gateway": {
            "redis": {"existingSecret": "kvpool-redis"},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 2,
                "maxReplicas": 6,
                "targetInFlightPerReplica": "200",
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
            },
        }
    }
    docs = render(values)
    assert "replicas" not in gateway_deployment(docs)["spec"]
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"]["name"] == gateway_deployment(docs)["metadata"]["name"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    kinds = {m["type"]: m for m in spec["metrics"]}
    assert kinds["Resource"]["resource"]["target"]["averageUtilization"] == 70
    assert kinds["Pods"]["pods"]["metric"]["name"] == "kvpool_gateway_in_flight"
    assert spec["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 300}}
    kubernetes_validate.validate(hpa, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(
    ("autoscaling", "redis", "message"),
    [
        pytest.param({}, "", "gateway.autoscaling needs Redis", id="no-redis"),
        pytest.param(
            {"minReplicas": 4, "maxReplicas": 2},
            REDIS,
            "maxReplicas \\(2\\) is below",
            id="max-below-min",
        ),
        pytest.param(
            {"targetCPUUtilizationPercentage": None}, REDIS, "has no metric", id="no-metric"
        ),
    ],
)
def test_chart_refuses_autoscaling_it_cannot_do_safely(
    autoscaling: dict[str, Any], redis: str, message: str
) -> None:
    values = {"gateway": {"redis": {"url": redis}, "autoscaling": {"enabled": True, **autoscaling}}}
    with pytest.raises(helm_python.HelmError, match=message):
        render(values)


@pytest.mark.parametrize(
    ("replicas", "redis", "accepted"),
    [
        pytest.param(1, "", True, id="one-replica-memory-budgets"),
        pytest.param(2, "", False, id="two-replicas-without-redis-refused"),
        pytest.param(5, "", False, id="five-replicas-without-redis-refused"),
        pytest.param(2, REDIS, True, id="two-replicas-with-redis"),
        pytest.param(3, "rediss://r:6380/1", True, id="three-replicas-with-tls-redis"),
    ],
)
def test_chart_allows_several_gateways_only_with_redis(
    replicas: int, redis: str, accepted: bool
) -> None:
    values = {"gateway": {"replicas": replicas, "redis": {"url": redis}}}
    if accepted:
        assert gateway_deployment(render(values))["spec"]["replicas"] == replicas
    else:
        with pytest.raises(helm_python.HelmError, match="replicas"):
            render(values)


def test_default_gateway_drains_within_its_grace_period_after_a_prestop_sleep() -> None:
    spec = pod_spec(gateway_deployment(render()))
    container = spec["containers"][0]

    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    drain = next(
        float(a.split("=", 1)[1]) for a in container["args"] if a.startswith("--shutdown-timeout=")
    )
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert sleep > 0
    assert spec["terminationGracePeriodSeconds"] > sleep + drain


@pytest.mark.parametrize(
    "gateway",
    [
        pytest.param({"terminationGracePeriodSeconds": 30}, id="grace-equals-drain"),
        pytest.param({"terminationGracePeriodSeconds": 35}, id="grace-equals-sleep-plus-drain"),
        pytest.param(
            {"shutdownTimeoutSeconds": 60, "terminationGracePeriodSeconds": 45},
            id="drain-longer-than-grace",
        ),
    ],
)
def test_chart_refuses_a_grace_period_that_cuts_the_drain(gateway: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError, match="terminationGracePeriodSeconds"):
        render({"gateway": gateway})


def test_no_prestop_when_the_sleep_is_zero() -> None:
    container = pod_spec(gateway_deployment(render({"gateway": {"preStopSleepSeconds": 0}})))[
        "containers"
    ][0]

    assert "lifecycle" not in container


def test_default_gateway_has_a_pdb_that_never_blocks_a_drain() -> None:
    docs = render()

    (pdb,) = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    gateway = gateway_deployment(docs)
    assert pdb["spec"]["selector"]["matchLabels"] == gateway["spec"]["selector"]["matchLabels"]
    assert pdb["metadata"]["namespace"] == gateway["metadata"]["namespace"]


def test_pdb_can_be_turned_off_or_set_as_a_percentage() -> None:
    assert (
        by_kind(
            render({"gateway": {"podDisruptionBudget": {"enabled": False}}}), "PodDisruptionBudget"
        )
        == []
    )
    (pdb,) = by_kind(
        render({"gateway": {"podDisruptionBudget": {"maxUnavailable": "25%"}}}),
        "PodDisruptionBudget",
    )
    assert pdb["spec"]["maxUnavailable"] == "25%"


def test_default_spread_over_nodes_selects_the_gateway_pods() -> None:
    gateway = gateway_deployment(render())

    (constraint,) = pod_spec(gateway)["topologySpreadConstraints"]
    assert constraint["topologyKey"] == "kubernetes.io/hostname"
    assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"  # one node still schedules
    assert constraint["labelSelector"]["matchLabels"] == gateway["spec"]["selector"]["matchLabels"]


def test_spread_constraints_are_configurable_and_can_be_removed() -> None:
    zone = {
        "maxSkew": 2,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"team": "llm"}},
    }
    spec = pod_spec(gateway_deployment(render({"gateway": {"topologySpreadConstraints": [zone]}})))
    assert spec["topologySpreadConstraints"] == [zone]
    spec = pod_spec(gateway_deployment(render({"gateway": {"topologySpreadConstraints": []}})))
    assert "topologySpreadConstraints" not in spec


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]}
            ]
        }
    }
}
SCHEDULING = {
    "affinity": AFFINITY,
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    ],
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/scrape": "yes"},
    "serviceAccount": {"annotations": {"iam.example.com/role": "kvpool"}},
}


@pytest.mark.parametrize("component", ["gateway", "operator"])
def test_scheduling_and_annotation_knobs_reach_the_pods(component: str) -> None:
    docs = render({component: SCHEDULING})
    deployment = (gateway_deployment if component == "gateway" else operator_deployment)(docs)
    spec = pod_spec(deployment)

    assert spec["affinity"] == AFFINITY
    assert spec["nodeSelector"] == SCHEDULING["nodeSelector"]
    assert spec["tolerations"] == SCHEDULING["tolerations"]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert deployment["spec"]["template"]["metadata"]["annotations"] == SCHEDULING["podAnnotations"]
    account = next(
        d
        for d in by_kind(docs, "ServiceAccount")
        if d["metadata"]["name"] == spec["serviceAccountName"]
    )
    assert account["metadata"]["annotations"] == {"iam.example.com/role": "kvpool"}
    for doc in docs:
        if doc["kind"] not in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_defaults_set_no_scheduling_knobs() -> None:
    docs = render()
    for deployment in by_kind(docs, "Deployment"):
        spec = pod_spec(deployment)
        assert not {"affinity", "priorityClassName", "nodeSelector", "tolerations"} & set(spec)
        assert "annotations" not in deployment["spec"]["template"]["metadata"]
    for account in by_kind(docs, "ServiceAccount"):
        assert "annotations" not in account["metadata"]


def test_service_port_is_configurable_and_targets_the_container_port() -> None:
    docs = render({"gateway": {"service": {"port": 8080}, "port": 9000, "metricsPort": 9001}})

    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    assert services["kvpool-gateway"]["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http"}
    ]
    assert services["kvpool-gateway-metrics"]["spec"]["ports"] == [
        {"name": "metrics", "port": 9001, "targetPort": "metrics"}
    ]
    container = pod_spec(gateway_deployment(docs))["containers"][0]
    assert container["ports"] == [
        {"name": "http", "containerPort": 9000},
        {"name": "metrics", "containerPort": 9001},
    ]
    assert "--metrics-listen=0.0.0.0:9001" in container["args"]


# --- namespaces and NOTES -------------------------------------------------------------------


def test_chart_refuses_a_gateway_outside_the_watched_namespace() -> None:
    with pytest.raises(helm_python.HelmError, match=r"must equal operator\.watchNamespace"):
        render({"operator": {"watchNamespace": "llm"}})
    docs = render({"operator": {"watchNamespace": "llm"}, "gateway": {"poolNamespace": "llm"}})
    assert "--configmap=llm" in pod_spec(gateway_deployment(docs))["containers"][0]["args"]


def test_notes_name_the_served_namespace_and_how_to_serve_the_examples() -> None:
    text = notes()

    assert "serves the ModelPools of namespace kvpool-system only" in text
    assert "--set gateway.poolNamespace=llm" in text  # the examples' namespace
    assert "kubectl get kvpool -n kvpool-system" in text
    assert "port-forward svc/kvpool-gateway 8080:80" in text
    assert "helm test kvpool -n kvpool-system" in text
    assert "1 replica, budgets in memory" in text


def test_notes_for_the_examples_namespace_print_its_commands_and_no_hint() -> None:
    text = notes({"gateway": {"poolNamespace": "llm", "replicas": 2, "redis": {"url": REDIS}}})

    assert "serves the ModelPools of namespace llm only" in text
    assert "--set gateway.poolNamespace" not in text
    assert "kubectl get kvpool -n llm" in text
    assert "kubectl -n kvpool-system port-forward svc/kvpool-gateway" in text
    assert "2 replicas, budgets in Redis" in text


def test_notes_commands_use_the_rendered_service() -> None:
    docs = render({"gateway": {"service": {"port": 8081}}})
    service = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("gateway"))
    forward = re.search(
        r"port-forward svc/(\S+) 8080:(\d+)", notes({"gateway": {"service": {"port": 8081}}})
    )

    assert forward is not None
    assert forward.group(1) == service["metadata"]["name"]
    assert int(forward.group(2)) == service["spec"]["ports"][0]["port"]


# --- monitoring labels ----------------------------------------------------------------------


def test_monitors_carry_the_kube_prometheus_stack_release_label_by_default() -> None:
    docs = render({"serviceMonitor": {"enabled": True}, "engineMonitor": {"enabled": True}})

    monitors = by_kind(docs, "ServiceMonitor") + by_kind(docs, "PodMonitor")
    assert len(monitors) == 3
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_monitor_labels_are_configurable() -> None:
    docs = render(
        {
            "monitoring": {"labels": {"prometheus": "platform", "release": None}},
            "serviceMonitor": {"enabled": True},
            "engineMonitor": {"enabled": True},
        }
    )
    for monitor in by_kind(docs, "ServiceMonitor") + by_kind(docs, "PodMonitor"):
        assert monitor["metadata"]["labels"]["prometheus"] == "platform"
        assert "release" not in monitor["metadata"]["labels"]  # null removes a default key


# --- helm test ------------------------------------------------------------------------------


def test_helm_test_pod_calls_the_gateway_service_without_a_key_by_default() -> None:
    docs = render()
    (pod,) = by_kind(docs, "Pod")
    service = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("gateway"))

    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    name, ns, port = service["metadata"]["name"], service["metadata"]["namespace"], 80
    assert env["GATEWAY_URL"]["value"] == f"http://{name}.{ns}.svc:{port}"
    assert "MODEL" not in env
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_helm_test_pod_sends_a_completion_as_the_configured_tenant() -> None:
    (pod,) = by_kind(
        render(
            {
                "helmTest": {
                    "model": "tiny",
                    "apiKeySecret": {"name": "chat-product-key", "key": "api-key"},
                }
            }
        ),
        "Pod",
    )
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}

    assert env["MODEL"]["value"] == "tiny"
    assert env["API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "chat-product-key",
        "key": "api-key",
    }


def test_helm_test_model_without_a_key_is_refused() -> None:
    with pytest.raises(helm_python.HelmError, match="apiKeySecret"):
        render({"helmTest": {"model": "tiny"}})


def test_no_helm_test_pod_without_a_gateway() -> None:
    assert by_kind(render({"gateway": {"enabled": False}}), "Pod") == []


# --- tokenizers -----------------------------------------------------------------------------


def test_no_tokenizer_volume_by_default() -> None:
    spec = pod_spec(gateway_deployment(render()))

    assert "volumes" not in spec
    assert "volumeMounts" not in spec["containers"][0]


@pytest.mark.parametrize(
    "volume",
    [
        pytest.param({"persistentVolumeClaim": {"claimName": "tokenizers"}}, id="pvc"),
        pytest.param({"configMap": {"name": "tiny-tokenizer"}}, id="configmap"),
    ],
)
def test_tokenizer_volume_is_mounted_read_only_where_pools_point(volume: dict[str, Any]) -> None:
    docs = render({"gateway": {"tokenizers": {"volume": volume, "mountPath": "/models"}}})
    spec = pod_spec(gateway_deployment(docs))

    assert spec["volumes"] == [{"name": "tokenizers", **volume}]
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "tokenizers", "mountPath": "/models", "readOnly": True}
    ]
    kubernetes_validate.validate(gateway_deployment(docs), KUBE_VERSION, strict=True)


def test_tokenizer_mount_path_must_be_absolute() -> None:
    with pytest.raises(helm_python.HelmError, match="mountPath"):
        render({"gateway": {"tokenizers": {"mountPath": "tokenizers"}}})
