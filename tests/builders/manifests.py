"""Builders of the custom resources and Secrets a user applies, as manifests (dicts) or as
the pydantic models the operator reads: start from a valid object, change what the case is
about (Kueue-style).

>>> pool = modelpool_manifest("chat").peak(interactive=60).replicas(1, 8).obj()
>>> policy = tierpolicy_manifest().tier("interactive", floor=50).tier("batch", floor=30).obj()
>>> budget = tenantbudget_manifest("acme").tiers("interactive").limit("1h", 1000).dict()
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy


class TierPolicyManifestBuilder:
    """A TierPolicy manifest (dict) under construction."""

    def __init__(self, name: str = "tiers", namespace: str = "default") -> None:
        self._doc: dict[str, Any] = {
            "apiVersion": "kvpool.dev/v1alpha1",
            "kind": "TierPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"tiers": [], "classification": []},
        }

    def tier(
        self, name: str, floor: int, lend: int = 100, max_wait: str = "2s", **extra: Any
    ) -> TierPolicyManifestBuilder:
        entry = {"name": name, "floorPercent": floor, "lendPercent": lend, "maxQueueWait": max_wait}
        self._doc["spec"]["tiers"].append(entry | extra)
        return self

    def rule(self, tier: str, **matchers: Any) -> TierPolicyManifestBuilder:
        self._doc["spec"]["classification"].append({**matchers, "tier": tier})
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc)

    def obj(self) -> TierPolicy:
        return TierPolicy.model_validate(self._doc)


class ModelPoolManifestBuilder:
    """A ModelPool manifest (dict) under construction, valid by default."""

    def __init__(self, name: str = "chat", namespace: str = "default") -> None:
        self._doc: dict[str, Any] = {
            "apiVersion": "kvpool.dev/v1alpha1",
            "kind": "ModelPool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": {"name": "org/model-8b", "servedName": name, "version": "v1"},
                "engine": {"maxNumSeqs": 256, "maxModelLen": 8192},
                "tierPolicyRef": {"name": "tiers"},
                "workload": {
                    "promptTokens": {"mean": 1000, "p95": 2048},
                    "outputTokens": {"mean": 300, "p95": 1024},
                },
                "capacity": {"minReplicas": 1, "maxReplicas": 8, "headroomPercent": 20},
            },
        }

    def policy(self, name: str) -> ModelPoolManifestBuilder:
        self._doc["spec"]["tierPolicyRef"] = {"name": name}
        return self

    def lengths(self, prompt: tuple[int, int], output: tuple[int, int]) -> ModelPoolManifestBuilder:
        self._doc["spec"]["workload"] = {
            "promptTokens": {"mean": prompt[0], "p95": prompt[1]},
            "outputTokens": {"mean": output[0], "p95": output[1]},
        }
        return self

    def engine(self, **fields: Any) -> ModelPoolManifestBuilder:
        self._doc["spec"]["engine"].update(fields)
        return self

    def replicas(self, minimum: int, maximum: int) -> ModelPoolManifestBuilder:
        self._doc["spec"]["capacity"].update(minReplicas=minimum, maxReplicas=maximum)
        return self

    def peak(self, **per_tier: int) -> ModelPoolManifestBuilder:
        self._doc["spec"]["capacity"]["peakConcurrency"] = dict(per_tier)
        return self

    def capacity(self, **fields: Any) -> ModelPoolManifestBuilder:
        self._doc["spec"]["capacity"].update(fields)
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc)

    def obj(self) -> ModelPool:
        return ModelPool.model_validate(self._doc)


class TenantBudgetManifestBuilder:
    """A TenantBudget manifest (dict) under construction, valid by default."""

    def __init__(self, tenant: str, namespace: str = "default") -> None:
        self._doc: dict[str, Any] = {
            "apiVersion": "kvpool.dev/v1alpha1",
            "kind": "TenantBudget",
            "metadata": {"name": tenant, "namespace": namespace, "labels": {}},
            "spec": {
                "tenant": tenant,
                "apiKeySecretRef": {"name": f"{tenant}-key", "key": "api-key"},
                "tiers": ["interactive"],
            },
        }

    def tiers(self, *names: str) -> TenantBudgetManifestBuilder:
        self._doc["spec"]["tiers"] = list(names)
        return self

    def limit(
        self, window: str, tokens: int, requests: int | None = None
    ) -> TenantBudgetManifestBuilder:
        entry: dict[str, Any] = {"window": window, "tokens": tokens}
        if requests is not None:
            entry["requests"] = requests
        self._doc["spec"].setdefault("limits", []).append(entry)
        return self

    def policy(self, name: str) -> TenantBudgetManifestBuilder:
        self._doc["spec"]["tierPolicyRef"] = {"name": name}
        return self

    def labels(self, **labels: str) -> TenantBudgetManifestBuilder:
        self._doc["metadata"]["labels"].update(labels)
        return self

    def spec(self, **fields: Any) -> TenantBudgetManifestBuilder:
        self._doc["spec"].update(fields)
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc)

    def obj(self) -> TenantBudget:
        return TenantBudget.model_validate(self._doc)


def tierpolicy_manifest(
    name: str = "tiers", namespace: str = "default"
) -> TierPolicyManifestBuilder:
    """An empty TierPolicy (add ``.tier(...)`` and ``.rule(...)``)."""
    return TierPolicyManifestBuilder(name, namespace)


def standard_tierpolicy_manifest() -> TierPolicyManifestBuilder:
    """interactive 50% / batch 30% (lends half) / eval 10%: the docs' worked example policy."""
    return (
        tierpolicy_manifest()
        .tier("interactive", floor=50, lend=100, max_wait="2s")
        .tier("batch", floor=30, lend=50, max_wait="60s")
        .tier("eval", floor=10, lend=100, max_wait="10m")
    )


def modelpool_manifest(name: str = "chat", namespace: str = "default") -> ModelPoolManifestBuilder:
    """A valid ModelPool of an 8B model referencing TierPolicy ``tiers``, 1-8 replicas."""
    return ModelPoolManifestBuilder(name, namespace)


def declared_modelpool_manifest(name: str = "chat", peak: int = 6) -> ModelPoolManifestBuilder:
    """The pool of the operator's integration tests: declared 3,000 KV tokens per replica,
    p95 200 + 100 tokens a sequence, interactive peak ``peak``, 1-8 replicas (see
    tests/integration/test_operator.py for the numbers)."""
    return (
        modelpool_manifest(name)
        .lengths((100, 200), (50, 100))
        .peak(interactive=peak)
        .replicas(1, 8)
        .capacity(kvTokensPerReplica=3000)
        .engine(maxModelLen=2048)  # the declared 3,000 tokens must hold one whole sequence
    )


def served_modelpool(
    builder: ModelPoolManifestBuilder, uid: str = "uid-1", generation: int = 1
) -> ModelPool:
    """A pool as read back from the API server (uid and generation set)."""
    doc = builder.dict()
    doc["metadata"].update(uid=uid, generation=generation)
    return ModelPool.model_validate(doc)


def tenantbudget_manifest(tenant: str, namespace: str = "default") -> TenantBudgetManifestBuilder:
    """A TenantBudget of ``tenant`` (tier interactive, key in Secret ``<tenant>-key``)."""
    return TenantBudgetManifestBuilder(tenant, namespace)


def apikey_secret_manifest(
    name: str, key: str, value: str, namespace: str = "default"
) -> dict[str, Any]:
    """A v1 Secret with one base64-encoded key, labelled ``kvpool.dev/api-key`` for the
    operator to read."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kvpool.dev/api-key": "true"},
        },
        "type": "Opaque",
        "data": {key: base64.b64encode(value.encode()).decode()},
    }
