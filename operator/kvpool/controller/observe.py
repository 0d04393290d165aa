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
from kvpool.api.modelpool import LoadStatus, ModelPoolStatus
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller.clock import utc_now
from kvpool.domain.measurement import (
    METRICS_OFF,
    METRICS_OK,
    NO_DATA,
    PROMETHEUS_DOWN,
    MetricsState,
    ReplicaReading,
)

if TYPE_CHECKING:
    from kvpool.controller.context import Operator

log = logging.getLogger(__name__)

Body = Mapping[str, Any]


async def observe_policy(op: Operator, namespace: str, name: str) -> TierPolicy | None:
    """The pool's TierPolicy from the cache, confirmed by a read when the cache has none."""
    body: Mapping[str, Any] | None = op.cache.policy(namespace, name)
    if body is None:
        body = await op.kube.get(kube.TIERPOLICIES, namespace, name)
    if body is None:
        return None
    try:
        return op.cache.parsed(TierPolicy, body)
    except pydantic.ValidationError:
        log.warning("TierPolicy %s/%s does not parse; treating it as missing", namespace, name)
        return None


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
