"""The operator's child objects: revision hash, Deployment, Service, PDB, admission ConfigMap."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from kvpool.domain import manifests as m
from kvpool.domain.revision import revision_of
from tests.builders import modelpool_manifest, served_modelpool

K8S_VERSION = "1.30.0"


def _pool(**engine: Any) -> Any:
    builder = modelpool_manifest("chat").engine(**engine) if engine else modelpool_manifest("chat")
    return served_modelpool(builder)


# --- revision ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "new_revision"),
    [
        (lambda b: b.engine(image="vllm/vllm-openai:v0.12.0"), True),
        (lambda b: b.engine(args=["--enable-prefix-caching"]), True),
        (lambda b: b.engine(maxModelLen=4096), True),
        (lambda b: b.engine(maxNumSeqs=64), True),
        (lambda b: b.engine(port=9000), True),
        (lambda b: b.engine(nodeSelector={"gpu": "h100"}), True),
        (lambda b: b.engine(env=[{"name": "A", "value": "1"}]), True),
        (lambda b: b.peak(interactive=10), False),
        (lambda b: b.replicas(2, 9), False),
        (lambda b: b.capacity(kvUtilizationTarget=80), False),
        (lambda b: b.lengths((10, 20), (10, 20)), False),
        (lambda b: b.policy("other"), False),
    ],
    ids=[
        "image",
        "extra-args",
        "max-model-len",
        "max-num-seqs",
        "port",
        "node-selector",
        "env",
        "peak-is-planning-only",
        "replica-bounds",
        "utilisation-target",
        "workload",
        "tier-policy",
    ],
)
def test_revision_changes_exactly_with_what_defines_the_engine(
    change: Any, new_revision: bool
) -> None:
    base = modelpool_manifest("chat")
    before = revision_of(base.obj().spec)
    after = revision_of(change(modelpool_manifest("chat")).obj().spec)
    assert (before != after) is new_revision
    assert len(after) == 10 and after == revision_of(change(modelpool_manifest("chat")).obj().spec)


def test_model_version_is_a_new_revision() -> None:
    doc = modelpool_manifest("chat").dict()
    doc["spec"]["model"]["version"] = "v2"
    from kvpool.api.modelpool import ModelPool

    assert revision_of(ModelPool.model_validate(doc).spec) != revision_of(
        modelpool_manifest("chat").obj().spec
    )


# --- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "suffix", "expected_len"),
    [
        ("chat", "stable", 11),
        ("a" * 56, "stable", 63),
        ("a" * 63, "canary", 63),
        ("a" * 63, None, 63),
    ],
    ids=["short", "exactly-63", "hashed-with-suffix", "no-suffix"],
)
def test_child_names_are_deterministic_dns_labels(
    pool: str, suffix: str | None, expected_len: int
) -> None:
    name = m.child_name(pool, suffix)
    assert len(name) == expected_len
    assert name == m.child_name(pool, suffix)
    assert name[0].isalnum() and name[-1].isalnum()
    if suffix:
        assert name.endswith(suffix)


# --- deployment ----------------------------------------------------------------------------


def test_engine_args_derive_from_the_spec_then_pass_extra_args() -> None:
    pool = _pool(maxNumSeqs=32, maxModelLen=4096, port=8001, args=["--enforce-eager"])
    args = m.build_engine_args(pool)
    assert args[:7] == [
        "--model=org/model-8b",
        "--served-model-name=chat",
        "--host=0.0.0.0",
        "--port=8001",
        "--max-num-seqs=32",
        "--max-model-len=4096",
        "--scheduling-policy=priority",
    ]
    assert args[-1] == "--enforce-eager"


def test_deployment_carries_labels_probes_scrape_annotations_and_owner() -> None:
    pool = _pool(
        nodeSelector={"gpu": "h100"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        resources={"limits": {"nvidia.com/gpu": 1}},
    )
    dep = m.build_deployment(pool, "abc1234567", 3, "stable")
    meta, spec = dep["metadata"], dep["spec"]
    assert meta["name"] == "chat-stable"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "kvpool.dev/v1alpha1",
            "kind": "ModelPool",
            "name": "chat",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert spec["replicas"] == 3
    assert spec["selector"]["matchLabels"] == {
        "kvpool.dev/pool": "chat",
        "kvpool.dev/track": "stable",
    }
    pod = spec["template"]
    assert pod["metadata"]["labels"]["kvpool.dev/revision"] == "abc1234567"
    assert pod["metadata"]["labels"]["kvpool.dev/track"] == "stable"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.11.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": 8000}
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 1}, "requests": {}}
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_spec_hash_ignores_replicas_but_not_the_template() -> None:
    pool = _pool()
    a = m.build_deployment(pool, "r1", 1, "stable")
    b = m.build_deployment(pool, "r1", 5, "stable")
    c = m.build_deployment(pool, "r2", 1, "stable")
    hash_of = lambda d: d["metadata"]["annotations"][m.ANNOTATION_SPEC_HASH]  # noqa: E731
    assert hash_of(a) == hash_of(b)
    assert hash_of(a) != hash_of(c)


@pytest.mark.parametrize("track", ["stable", "canary"])
def test_one_service_per_track_selects_that_track(track: m.Track) -> None:
    svc = m.build_service(_pool(port=8123), track)
    assert svc["metadata"]["name"] == f"chat-{track}"
    assert svc["spec"]["selector"] == {"kvpool.dev/pool": "chat", "kvpool.dev/track": track}
    assert svc["spec"]["ports"][0]["port"] == 8123


@pytest.mark.parametrize(
    ("min_replicas", "warm", "min_available"),
    [(1, 3, 1), (2, 3, 2), (3, 2, 2), (0, 2, 0)],
    ids=["floor-below-warm", "floor-two", "warm-below-floor", "no-floor"],
)
def test_pdb_keeps_the_warm_floor(min_replicas: int, warm: int, min_available: int) -> None:
    pool = served_modelpool(modelpool_manifest("chat").replicas(min_replicas, 8))
    pdb = m.build_pdb(pool, warm)
    assert pdb["spec"]["minAvailable"] == min_available
    assert pdb["spec"]["selector"] == {"matchLabels": {"kvpool.dev/pool": "chat"}}


@pytest.mark.parametrize(
    "build",
    [
        lambda p: m.build_deployment(p, "r1", 2, "stable"),
        lambda p: m.build_service(p, "stable"),
        lambda p: m.build_pdb(p, 2),
        lambda p: m.build_admission_configmap("default", "{}", "h"),
    ],
    ids=["deployment", "service", "pdb", "configmap"],
)
def test_children_are_valid_kubernetes_objects(build: Any) -> None:
    obj = build(_pool(tolerations=[{"key": "k", "operator": "Exists"}], nodeSelector={"a": "b"}))
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
