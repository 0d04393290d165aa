"""Builders for the operator's tests: tenants, secrets, pod views and pool objects as the API
server returns them (with uid and generation), on top of tests/builders.py.

>>> budget = make_budget("acme").tiers("interactive").limit("1h", 1000).obj()
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from tests.builders import PoolBuilder, make_pool, standard_policy

__all__ = [
    "declared_pool",
    "make_budget",
    "make_pool",
    "make_secret",
    "served_pool",
    "standard_policy",
]


def declared_pool(name: str = "chat", peak: int = 6) -> PoolBuilder:
    """The pool of the operator's integration tests: declared 3,000 KV tokens per replica,
    p95 200 + 100 tokens a sequence, interactive peak ``peak``, 1-8 replicas (see
    tests/integration/test_operator.py for the numbers)."""
    return (
        make_pool(name)
        .lengths((100, 200), (50, 100))
        .peak(interactive=peak)
        .replicas(1, 8)
        .capacity(kvTokensPerReplica=3000)
        .engine(maxModelLen=2048)  # the declared 3,000 tokens must hold one whole sequence
    )


class BudgetBuilder:
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

    def tiers(self, *names: str) -> BudgetBuilder:
        self._doc["spec"]["tiers"] = list(names)
        return self

    def limit(self, window: str, tokens: int, requests: int | None = None) -> BudgetBuilder:
        entry: dict[str, Any] = {"window": window, "tokens": tokens}
        if requests is not None:
            entry["requests"] = requests
        self._doc["spec"].setdefault("limits", []).append(entry)
        return self

    def policy(self, name: str) -> BudgetBuilder:
        self._doc["spec"]["tierPolicyRef"] = {"name": name}
        return self

    def labels(self, **labels: str) -> BudgetBuilder:
        self._doc["metadata"]["labels"].update(labels)
        return self

    def spec(self, **fields: Any) -> BudgetBuilder:
        self._doc["spec"].update(fields)
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc)

    def obj(self) -> TenantBudget:
        return TenantBudget.model_validate(self._doc)


def make_budget(tenant: str, namespace: str = "default") -> BudgetBuilder:
    return BudgetBuilder(tenant, namespace)


def make_secret(name: str, key: str, value: str, namespace: str = "default") -> dict[str, Any]:
    """A v1 Secret with one base64-encoded key, labelled for the operator to read."""
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


def served_pool(builder: PoolBuilder, uid: str = "uid-1", generation: int = 1) -> ModelPool:
    """A pool as read back from the API server (uid and generation set)."""
    doc = builder.dict()
    doc["metadata"].update(uid=uid, generation=generation)
    return ModelPool.model_validate(doc)
