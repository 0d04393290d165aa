"""Reading what a reconcile decides from: the pool's TierPolicy, its metrics, its last status.

Why it exists: the pool reconciler and the config publisher both need a pool's prior
status and the parsed objects from the cache; observation is I/O (the API server, the
shared Prometheus snapshot) and stays out of the pure decisions in ``kvpool.domain``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from kvpool.adapters import kube
from kvpool.adapters.prometheus import MetricsSnapshot, PrometheusUnavailable, SnapshotCache
from kvpool.api.modelpool import LoadStatus, ModelPoolStatus
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller.cache import Cache
from kvpool.controller.clock import Clock, rfc3339
from kvpool.controller.metrics import OperatorMetrics
from kvpool.controller.state import PoolKey
from kvpool.domain.measurement import (
    METRICS_OFF,
    METRICS_OK,
    NO_DATA,
    PROMETHEUS_DOWN,
    MetricsState,
    ReplicaReading,
)
from kvpool.domain.validity import Checked, NamespaceVerdicts, assess_namespace

Body = Mapping[str, Any]


async def observe_policy(
    cache: Cache, client: kube.KubeClient, namespace: str, name: str
) -> Checked[TierPolicy] | None:
    """The pool's TierPolicy (checked) from the cache, confirmed by a read when the cache
    has none; None when it does not exist."""
    body: Mapping[str, Any] | None = cache.policy(namespace, name)
    if body is None:
        body = await client.get(kube.TIERPOLICIES, namespace, name)
    if body is None:
        return None
    checked: Checked[TierPolicy] = cache.checked(body)
    return checked


def checked_objects(
    cache: Cache, table: Mapping[str, Mapping[str, Mapping[str, Any]]], namespace: str
) -> list[Checked[Any]]:
    """The checked objects of one cache table in a namespace (those being deleted left out)."""
    return [
        cache.checked(body)
        for body in list(table.get(namespace, {}).values())
        if not (body.get("metadata") or {}).get("deletionTimestamp")
    ]


def key_digests(cache: Cache, namespace: str, budget: TenantBudget) -> list[str]:
    """The digests of a TenantBudget's API keys that the operator holds (resolved keys)."""
    found = (
        cache.secrets.get((namespace, ref.name), {}).get(ref.key) for _, ref in budget.key_refs()
    )
    return [digest for digest in found if digest is not None]


def assess_cached_namespace(cache: Cache, namespace: str) -> NamespaceVerdicts:
    """The verdict of every ModelPool, TierPolicy and TenantBudget of a namespace (a
    TenantBudget sharing an API key with another is refused, both of them)."""
    budgets = checked_objects(cache, cache.budgets, namespace)
    return assess_namespace(
        checked_objects(cache, cache.pools, namespace),
        [cache.checked(b) for b in list(cache.policies.get(namespace, {}).values())],
        budgets,
        {b.name: key_digests(cache, namespace, b.model) for b in budgets if b.model is not None},
    )


@dataclass(frozen=True)
class MetricsObservation:
    """One pool's part of the shared Prometheus snapshot."""

    state: MetricsState  # whether Prometheus answered, and had this pool's engines
    message: str  # why not, for the MetricsUnavailable condition ("" when fresh)
    readings: tuple[ReplicaReading, ...] = ()  # KV capacity per replica of the revision
    load: LoadStatus | None = None  # live engine signals


async def observe_metrics(
    snapshots: SnapshotCache, metrics: OperatorMetrics, clock: Clock, key: PoolKey, revision: str
) -> MetricsObservation:
    """This pool's part of the shared Prometheus snapshot (and the measurement's age)."""
    snapshot = await snapshots.get()
    if snapshots.last_success is not None:
        metrics.measurement_age.set(clock.wall() - snapshots.last_success)
    if snapshot is None:
        return MetricsObservation(METRICS_OFF, "the operator runs without --prometheus-url")
    if isinstance(snapshot, PrometheusUnavailable):
        return MetricsObservation(PROMETHEUS_DOWN, snapshot.message)
    assert isinstance(snapshot, MetricsSnapshot)
    readings = snapshot.readings_for(*key, revision)
    live = snapshot.load.get(key)
    load = live.to_status(rfc3339(clock)) if live else None
    if not readings:
        message = f"Prometheus has no vllm:cache_config_info for revision {revision}"
        return MetricsObservation(NO_DATA, message, (), load)
    return MetricsObservation(METRICS_OK, "", readings, load)


def prior_status(
    statuses: Mapping[PoolKey, ModelPoolStatus], key: PoolKey, body: Body
) -> ModelPoolStatus | None:
    """The last status this process wrote for a pool, else the one stored on the object."""
    if key in statuses:
        return statuses[key]
    try:
        return ModelPoolStatus.model_validate(body.get("status") or {})
    except pydantic.ValidationError:
        return None
