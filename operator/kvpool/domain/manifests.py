"""Pure builders of the Kubernetes objects the operator owns for a ModelPool.

Why it exists: every child object is a function of the pool, its revision and the plan,
so it is built here without I/O and tested as data. The adapters only create or
merge-patch what these functions return (never PUT, never server-side apply).

Children of a pool ``P`` (names are deterministic, so a restarted operator finds what it
created instead of creating duplicates):

- Deployment ``P-<track>`` (track ``stable`` or ``canary``): vLLM engines, ``replicas`` =
  the plan's warm replicas;
- Service ``P-<track>``: a ClusterIP per track, the engine port;
- PodDisruptionBudget ``P``: ``minAvailable`` = the warm floor (``capacity.minReplicas``,
  at most the warm replicas). Voluntary disruptions (node drains) may take replicas above
  the floor but never below it; guarding every warm replica would block drains forever.

Labels on every child and pod: ``kvpool.dev/pool``, ``kvpool.dev/track``, and on pods
``kvpool.dev/revision`` (see :mod:`kvpool.domain.revision`). The Deployment selector
uses pool and track only (a selector is immutable; the revision changes).

Each child carries the annotation ``kvpool.dev/spec-hash``: a hash of what we own in it.
An apply compares hashes instead of objects, because a real API server adds defaults to
what we send and a field-by-field comparison would patch (and re-trigger) forever.

Worked example::

    >>> child_name("llama-8b", "stable")
    'llama-8b-stable'
    >>> len(child_name("p" * 63, "canary"))
    63
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from kvpool.api.admission_config import (
    CONFIGMAP_KEY,
    CONFIGMAP_NAME,
    SHARD_TENANTS_KEY,
    SHARDS_KEY,
)
from kvpool.api.common import API_VERSION
from kvpool.api.core import EnvVar
from kvpool.api.modelpool import ModelPool

Track = Literal["stable", "canary"]
TRACKS: tuple[Track, ...] = ("stable", "canary")

LABEL_POOL = "kvpool.dev/pool"
LABEL_REVISION = "kvpool.dev/revision"
LABEL_TRACK = "kvpool.dev/track"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "kvpool"
ANNOTATION_SPEC_HASH = "kvpool.dev/spec-hash"
ANNOTATION_CONFIG_HASH = "kvpool.dev/config-hash"
# held on every ModelPool the operator has acted on, so its children are removed on deletion
FINALIZER_OPERATOR = "kvpool.dev/operator"
LABEL_CONFIG_PART = "kvpool.dev/admission-config"  # tenant shards of the compiled config
CONFIG_PART_TENANTS = "tenants"
ANNOTATION_STATIC_ENDPOINTS = "kvpool.dev/static-endpoints"  # local mode: a pool's engines
ANNOTATION_CANARY_STATIC_ENDPOINTS = "kvpool.dev/canary-static-endpoints"  # and its canary's
ANNOTATION_ROLLOUT = "kvpool.dev/rollout"  # a user's rollout action (resume, abort, ...)

ENGINE_CONTAINER = "engine"
ENGINE_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
MAX_NAME = 63

JsonObject = dict[str, Any]


def child_name(pool: str, suffix: str | None = None) -> str:
    """A deterministic DNS-label name for a child of ``pool`` (hash-shortened if too long)."""
    name = f"{pool}-{suffix}" if suffix else pool
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    tail = f"-{digest}-{suffix}" if suffix else f"-{digest}"
    return pool[: MAX_NAME - len(tail)].rstrip("-") + tail


def spec_hash(obj: Any) -> str:
    """A stable short hash of a JSON-able value (canonical JSON, sorted keys)."""
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def build_labels(pool: str, track: Track | None = None) -> dict[str, str]:
    """Labels every child of a pool carries."""
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": pool,
        LABEL_POOL: pool,
    }
    if track is not None:
        labels[LABEL_TRACK] = track
    return labels


def build_selector(pool: str, track: Track) -> dict[str, str]:
    """The immutable selector of a track's pods: pool and track (not the revision)."""
    return {LABEL_POOL: pool, LABEL_TRACK: track}


def build_owner_reference(pool: ModelPool) -> JsonObject:
    """The ownerReference making the pool the controller of a child (for the real GC)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ModelPool",
        "name": pool.metadata.name,
        "uid": pool.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_engine_args(pool: ModelPool) -> list[str]:
    """The vLLM server arguments derived from the spec, then ``engine.args`` verbatim."""
    spec = pool.spec
    engine = spec.engine
    return [
        f"--model={spec.model.name}",
        f"--served-model-name={spec.model.served_name}",
        "--host=0.0.0.0",
        f"--port={engine.port}",
        f"--max-num-seqs={engine.max_num_seqs}",
        f"--max-model-len={engine.max_model_len}",
        "--scheduling-policy=priority",
        *engine.args,
    ]


def _probe(port: int, *, period: int, failures: int, initial: int = 0) -> JsonObject:
    probe: JsonObject = {
        "httpGet": {"path": "/health", "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }
    if initial:
        probe["initialDelaySeconds"] = initial
    return probe


def _metadata(pool: ModelPool, name: str, track: Track | None, body: JsonObject) -> JsonObject:
    """Metadata with labels, ownerReference and the spec-hash of ``body``."""
    return {
        "name": name,
        "namespace": pool.metadata.namespace,
        "labels": build_labels(pool.metadata.name, track),
        "annotations": {ANNOTATION_SPEC_HASH: spec_hash(body)},
        "ownerReferences": [build_owner_reference(pool)],
    }


def build_env_var(env: EnvVar) -> JsonObject:
    """One container env entry: ``{name, value}`` or ``{name, valueFrom}``."""
    if env.value_from is not None:
        return {"name": env.name, "valueFrom": env.value_from.to_wire()}
    return {"name": env.name, "value": env.value}


def add_pod_fields(pod_spec: JsonObject, container: JsonObject, pool: ModelPool) -> None:
    """The pod fields ``spec.engine`` passes through as they are (same names and shapes as
    a Pod spec); only those set are written, so pools that set none keep their spec-hash."""
    engine = pool.spec.engine
    container_fields: dict[str, Any] = {
        "envFrom": [e.to_wire() for e in engine.env_from],
        "volumeMounts": [v.to_wire() for v in engine.volume_mounts],
        "securityContext": engine.security_context.to_wire() if engine.security_context else None,
        "lifecycle": engine.lifecycle.to_wire() if engine.lifecycle else None,
    }
    pod_fields: dict[str, Any] = {
        "volumes": [dict(v) for v in engine.volumes],
        "serviceAccountName": engine.service_account_name,
        "imagePullSecrets": [r.to_wire() for r in engine.image_pull_secrets],
        "affinity": dict(engine.affinity) if engine.affinity else None,
        "priorityClassName": engine.priority_class_name,
        "securityContext": (
            engine.pod_security_context.to_wire() if engine.pod_security_context else None
        ),
        "terminationGracePeriodSeconds": engine.termination_grace_period_seconds,
    }
    container.update({k: v for k, v in container_fields.items() if v not in (None, [], {})})
    pod_spec.update({k: v for k, v in pod_fields.items() if v not in (None, [], {})})


def build_pod_template(pool: ModelPool, revision: str, track: Track) -> JsonObject:
    """The engine pod template (labels carry the revision; scrape annotations included)."""
    engine = pool.spec.engine
    container: JsonObject = {
        "name": ENGINE_CONTAINER,
        "image": engine.image,
        "command": list(ENGINE_COMMAND),
        "args": build_engine_args(pool),
        "ports": [{"name": "http", "containerPort": engine.port, "protocol": "TCP"}],
        "env": [build_env_var(e) for e in engine.env],
        "resources": engine.resources.to_wire(),
        # The engine loads weights before /health answers: a generous startup probe,
        # then readiness gates traffic and liveness restarts a wedged engine.
        "startupProbe": _probe(engine.port, period=10, failures=180),
        "readinessProbe": _probe(engine.port, period=5, failures=3),
        "livenessProbe": _probe(engine.port, period=10, failures=6),
    }
    pod_spec: JsonObject = {"containers": [container]}
    if engine.node_selector:
        pod_spec["nodeSelector"] = dict(engine.node_selector)
    if engine.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in engine.tolerations]
    add_pod_fields(pod_spec, container, pool)
    labels = build_labels(pool.metadata.name, track) | {LABEL_REVISION: revision}
    return {
        "metadata": {
            "labels": labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(engine.port),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": pod_spec,
    }


def build_deployment(pool: ModelPool, revision: str, replicas: int, track: Track) -> JsonObject:
    """The apps/v1 Deployment of one track of a pool with ``replicas`` warm engines.

    The spec-hash covers everything but ``replicas`` (scaling is compared on its own), and
    a surge-only rolling update keeps the warm capacity while a revision rolls.
    """
    name = pool.metadata.name
    spec: JsonObject = {
        "selector": {"matchLabels": build_selector(name, track)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "template": build_pod_template(pool, revision, track),
    }
    metadata = _metadata(pool, child_name(name, track), track, spec)
    metadata["labels"][LABEL_REVISION] = revision
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {"replicas": replicas, **spec},
    }


def build_service(pool: ModelPool, track: Track) -> JsonObject:
    """The ClusterIP Service of one track (the gateway may route to it or to pod IPs)."""
    name = pool.metadata.name
    port = pool.spec.engine.port
    spec: JsonObject = {
        "type": "ClusterIP",
        "selector": build_selector(name, track),
        "ports": [{"name": "http", "port": port, "targetPort": port, "protocol": "TCP"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool, child_name(name, track), track, spec),
        "spec": spec,
    }


def build_pdb(pool: ModelPool, replicas: int) -> JsonObject:
    """The policy/v1 PodDisruptionBudget keeping the warm floor of the pool's engines.

    ``minAvailable`` = ``min(capacity.minReplicas, replicas)``: drains may take replicas
    above the floor, never below it.
    """
    name = pool.metadata.name
    spec: JsonObject = {
        "minAvailable": min(pool.spec.capacity.min_replicas, replicas),
        "selector": {"matchLabels": {LABEL_POOL: name}},
    }
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(pool, child_name(name), None, spec),
        "spec": spec,
    }


def build_admission_configmap(
    namespace: str, config_json: str, config_hash: str, shards_json: str | None = None
) -> JsonObject:
    """The ConfigMap ``kvpool-admission`` holding the compiled admission config.

    ``config_hash`` is the hash of the content without ``generatedAt``: the operator
    rewrites the ConfigMap only when it differs. With ``shards_json`` it is the index of a
    sharded config (:mod:`kvpool.domain.config_shards`): ``config.json`` then holds the
    pools and policies and ``shards.json`` names the tenant shards.
    """
    data = {CONFIGMAP_KEY: config_json}
    if shards_json is not None:
        data[SHARDS_KEY] = shards_json
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CONFIGMAP_NAME,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {ANNOTATION_CONFIG_HASH: config_hash},
        },
        "data": data,
    }


def build_tenant_shard_configmap(namespace: str, name: str, tenants_json: str) -> JsonObject:
    """One tenant shard of a sharded admission config (its name carries its digest, so
    its content never changes; the operator deletes it once no index names it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_CONFIG_PART: CONFIG_PART_TENANTS},
            "annotations": {ANNOTATION_CONFIG_HASH: name.rsplit("-", 1)[-1]},
        },
        "data": {SHARD_TENANTS_KEY: tenants_json},
    }
