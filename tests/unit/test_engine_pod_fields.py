"""Engine pods that can run a real model: every pod field of spec.engine reaches the
Deployment, which the Kubernetes OpenAPI schema accepts (kubernetes-validate, strict)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from kvpool.api.validation import check_custom_object
from kvpool.domain import manifests as m
from kvpool.domain.revision import revision_of
from tests.builders import declared_modelpool_manifest, served_modelpool

KUBE_VERSION = kubernetes_validate.latest_version()

EVERY_POD_FIELD: dict[str, Any] = {
    "env": [
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ],
    "envFrom": [{"configMapRef": {"name": "vllm-env"}, "prefix": "VLLM_"}],
    "volumes": [
        {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
    ],
    "volumeMounts": [
        {"name": "cache", "mountPath": "/root/.cache/huggingface", "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ],
    "serviceAccountName": "vllm",
    "imagePullSecrets": [{"name": "registry"}],
    "nodeSelector": {"pool": "interactive"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                ]
            }
        }
    },
    "priorityClassName": "inference-high",
    "securityContext": {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "podSecurityContext": {"runAsUser": 1000, "fsGroup": 1000},
    "terminationGracePeriodSeconds": 120,
    "lifecycle": {"preStop": {"sleep": {"seconds": 15}}},
    "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "8", "memory": "64Gi"}},
}


def test_a_pool_using_every_pod_field_renders_a_deployment_kubernetes_accepts() -> None:
    doc = declared_modelpool_manifest().engine(**EVERY_POD_FIELD).dict()
    _, findings = check_custom_object(doc)
    assert findings == []  # the CRD schema and CEL rules accept it too
    pool = served_modelpool(declared_modelpool_manifest().engine(**EVERY_POD_FIELD))

    deployment = m.build_deployment(pool, revision_of(pool.spec), 2, "stable")
    kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)

    pod = deployment["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    assert engine["env"][1] == {"name": "HF_TOKEN", "valueFrom": EVERY_POD_FIELD["env"][1][
        "valueFrom"]}  # fmt: skip
    for field in ("envFrom", "volumeMounts", "securityContext", "lifecycle"):
        assert engine[field] == EVERY_POD_FIELD[field]
    pod_fields = ("volumes", "serviceAccountName", "imagePullSecrets", "affinity",
                  "priorityClassName", "terminationGracePeriodSeconds", "nodeSelector")  # fmt: skip
    for field in pod_fields:
        assert pod[field] == EVERY_POD_FIELD[field]
    assert pod["securityContext"] == EVERY_POD_FIELD["podSecurityContext"]


def test_pod_fields_left_unset_change_neither_revision_nor_deployment() -> None:
    plain = served_modelpool(declared_modelpool_manifest())
    deployment = m.build_deployment(plain, revision_of(plain.spec), 1, "stable")
    pod = deployment["spec"]["template"]["spec"]
    assert set(pod) == {"containers"}
    assert set(pod["containers"][0]) == {
        "name", "image", "command", "args", "ports", "env", "resources",
        "startupProbe", "readinessProbe", "livenessProbe",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "path"),
    [
        ({"volumeMounts": [{"name": "c", "mountPath": "/c"}]}, "spec.engine.volumeMounts[0].name"),
        ({"env": [{"name": "A", "valueFrom": {}}]}, "spec.engine.env[0].valueFrom"),
        ({"lifecycle": {"preStop": {}}}, "spec.engine.lifecycle.preStop"),
        ({"volumes": [{"emptyDir": {}}]}, "spec.engine.volumes[0].name"),
    ],
    ids=["mount-names-no-volume", "value-from-without-source", "pre-stop-without-action",
         "volume-without-name"],
)  # fmt: skip
def test_bad_pod_fields_are_refused_with_their_path(engine: dict[str, Any], path: str) -> None:
    _, findings = check_custom_object(declared_modelpool_manifest().engine(**engine).dict())
    assert path in [f.path for f in findings], findings


def test_revisions_of_pools_without_the_new_fields_are_unchanged() -> None:
    """The hashes the operator computed before these fields existed (an upgrade must not
    give every pool a new revision, i.e. restart every engine)."""
    from kvpool.api.modelpool import EngineSpec, ModelRef
    from kvpool.domain.revision import build_revision

    model = ModelRef(name="m", served_name="m", version="1")
    assert build_revision(model, EngineSpec(max_model_len=4096)) == "729bed3568"
    engine = EngineSpec(
        max_model_len=4096,
        image="x",
        args=["--a"],
        env=[{"name": "A", "value": "b"}],
        node_selector={"a": "b"},
        tolerations=[{"key": "k", "operator": "Exists"}],
        resources={"limits": {"nvidia.com/gpu": 1}},
    )
    assert build_revision(model, engine) == "3473009c8f"
