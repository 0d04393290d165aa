"""Reading what a reconcile decides from: the pool's TierPolicy, its metrics, its last status.

Why it exists: the pool reconciler and the config publisher both need a pool's prior
status and the parsed objects from the cache; observation is I/O (the API server, the
shared Prometheus snapshot) and stays out of the pure decisions in ``kvpool.domain``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pydantic

from kvpool.adapters import kube
from kvpool.adapters.prometheus import MetricsSnapshot, PrometheusUnavailable
from kvpool.api.modelpool import LoadStatus, ModelPool, ModelPoolStatus
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller.clock import utc_now
from kvpool.domain.manifests import ANNOTATION_STATIC_ENDPOINTS
from kvpool.domain.measurement import (
    METRICS_OFF,
    METRICS_OK,
    NO_DATA,
    PROMETHEUS_DOWN,
    MetricsState,
    ReplicaReading,
)
from kvpool.domain.validity import Checked, NamespaceVerdicts, assess_namespace

if TYPE_CHECKING:
    from kvpool.controller.context import Operator

log = logging.getLogger(__name__)

Body = Mapping[str, Any]


async def observe_policy(op: Operator, namespace: str, name: str) -> Checked[TierPolicy] | None:
    """The pool's TierPolicy (checked) from the cache, confirmed by a read when the cache
    has none; None when it does not exist."""
    body: Mapping[str, Any] | None = op.cache.policy(namespace, name)
    if body is None:
        body = await op.kube.get(kube.TIERPOLICIES, namespace, name)
    if body is None:
        return None
    checked: Checked[TierPolicy] = op.cache.checked(body)
    return checked


def checked_objects(
    op: Operator, table: Mapping[str, Mapping[str, Mapping[str, Any]]], namespace: str
) -> list[Checked[Any]]:
    """The checked objects of one cache table in a namespace (those being deleted left out)."""
    return [
        op.cache.checked(body)
        for body in list(table.get(namespace, {}).values())
        if not (body.get("metadata") or {}).get("deletionTimestamp")
    ]


def assess_cached_namespace(op: Operator, namespace: str) -> NamespaceVerdicts:
    """The verdict of every ModelPool, TierPolicy and TenantBudget of a namespace."""
    return assess_namespace(
        checked_objects(op, op.cache.pools, namespace),
        [op.cache.checked(b) for b in list(op.cache.policies.get(namespace, {}).values())],
        checked_objects(op, op.cache.budgets, namespace),
    )


async def observe_metrics(
    op: Operator, namespace: str, pool: str, revision: str
) -> tuple[MetricsState, str, tuple[ReplicaReading, ...], LoadStatus | None]:
    """This pool's part of the shared Prometheus snapshot."""
    snapshot = await op.snapshots.get()
    if op.snapshots.last_success is not None:
        op.metrics.measurement_age.set(time.time() - op.snapshots.last_success)
    if snapshot is None:
        return METRICS_OFF, "the operator runs without --prometheus-url", (), None
    if isinstance(snapshot, PrometheusUnavailable):
        return PROMETHEUS_DOWN, snapshot.message, (), None
    assert isinstance(snapshot, MetricsSnapshot)
    readings = snapshot.readings_for(namespace, pool, revision)
    load = snapshot.load.get((namespace, pool))
    if not readings:
        message = f"Prometheus has no vllm:cache_config_info for revision {revision}"
        return NO_DATA, message, (), load.to_status(utc_now()) if load else None
    return METRICS_OK, "", readings, load.to_status(utc_now()) if load else None


def resource_of(body: Body) -> dict[str, Any]:
    """A plain dict of an object without the fields our models do not describe."""
    return {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}


def prior_status(op: Operator, key: tuple[str, str], body: Body) -> ModelPoolStatus | None:
    """The last status this process wrote for a pool, else the one stored on the object."""
    if key in op.statuses:
        return op.statuses[key]
    try:
        return ModelPoolStatus.model_validate(body.get("status") or {})
    except pydantic.ValidationError:
        return None


def static_endpoints(
    op: Operator, pool: ModelPool, annotation: str = ANNOTATION_STATIC_ENDPOINTS
) -> str | None:
    """The pool's ``kvpool.dev/static-endpoints`` annotation (or the canary's, by
    ``annotation``), honoured only when the operator runs with ``--allow-static-endpoints``
    (local mode: no pods to discover). In a cluster it is ignored (and logged): anyone
    allowed to annotate a ModelPool could otherwise send every tenant's traffic for its
    model to any URL."""
    text = pool.metadata.annotations.get(annotation)
    if text and not op.config.allow_static_endpoints:
        key = (f"ignored:{annotation}", pool.metadata.namespace or "default", pool.metadata.name)
        if key not in op.warned:
            op.warned.add(key)
            log.warning(
                "ModelPool %s/%s: annotation %s ignored (the operator runs without "
                "--allow-static-endpoints)",
                *key[1:],
                annotation,
            )
        return None
    return text
