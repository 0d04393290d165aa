"""Builders for test objects, Kueue-style: start from a valid object, change what the case is about.

>>> pool = make_pool("chat").peak(interactive=60).replicas(1, 8).obj()
>>> policy = make_policy().tier("interactive", floor=50).tier("batch", floor=30).obj()
"""

from __future__ import annotations

import copy
from typing import Any

from kvpool.api.modelpool import ModelPool
from kvpool.api.tierpolicy import TierPolicy


class PolicyBuilder:
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
    ) -> PolicyBuilder:
        entry = {"name": name, "floorPercent": floor, "lendPercent": lend, "maxQueueWait": max_wait}
        self._doc["spec"]["tiers"].append(entry | extra)
        return self

    def rule(self, tier: str, **matchers: Any) -> PolicyBuilder:
        self._doc["spec"]["classification"].append({**matchers, "tier": tier})
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc)

    def obj(self) -> TierPolicy:
        return TierPolicy.model_validate(self._doc)


class PoolBuilder:
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

    def policy(self, name: str) -> PoolBuilder:
        self._doc["spec"]["tierPolicyRef"] = {"name": name}
        return self

    def lengths(self, prompt: tuple[int, int], output: tuple[int, int]) -> PoolBuilder:
        self._doc["spec"]["workload"] = {
            "promptTokens": {"mean": prompt[0], "p95": prompt[1]},
            "outputTokens": {"mean": output[0], "p95": output[1]},
        }
        return self

    def engine(self, **fields: Any) -> PoolBuilder:
        self._doc["spec"]["engine"].update(fields)
        return self

    def replicas(self, minimum: int, maximum: int) -> PoolBuilder:
        self._doc["spec"]["capacity"].update(minReplicas=minimum, maxReplicas=maximum)
        return self

    def peak(self, **per_tier: int) -> PoolBuilder:
        self._doc["spec"]["capacity"]["peakConcurrency"] = dict(per_tier)
        return self

    def capacity(self, **fields: Any) -> PoolBuilder:
        self._doc["spec"]["capacity"].update(fields)
        return self

    def dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._doc)

    def obj(self) -> ModelPool:
        return ModelPool.model_validate(self._doc)


def make_policy(name: str = "tiers", namespace: str = "default") -> PolicyBuilder:
    return PolicyBuilder(name, namespace)


def make_pool(name: str = "chat", namespace: str = "default") -> PoolBuilder:
    return PoolBuilder(name, namespace)


def standard_policy() -> PolicyBuilder:
    """interactive 50% / batch 30% (lends half) / eval 10%: the docs' worked example policy."""
    return (
        make_policy()
        .tier("interactive", floor=50, lend=100, max_wait="2s")
        .tier("batch", floor=30, lend=50, max_wait="60s")
        .tier("eval", floor=10, lend=100, max_wait="10m")
    )
