"""Publishing a namespace's compiled admission config (ConfigMap ``kvpool-admission``).

Why it exists: the gateway enforces one compiled config per namespace, built from every
pool's plan and endpoints, every TierPolicy and every tenant with a resolved key. This
module gathers those inputs from the cache (no API reads per publish), hands them to the
pure compiler (:func:`kvpool.domain.compile.build_admission_config`) and writes the
ConfigMap only when the config hash changed. The TierPolicy/TenantBudget statuses that
follow a publish are requested in the background (:mod:`.side_statuses`), so thousands
of tenants never delay the next publication.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import pydantic

from kvpool.adapters import kube
from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller.clock import utc_now
from kvpool.controller.observe import prior_status
from kvpool.controller.rollout import build_canary_input, stable_revision_of
from kvpool.domain import manifests as m
from kvpool.domain.compile import (
    PodView,
    PoolInput,
    TenantInput,
    build_admission_config,
    build_endpoints,
    config_hash,
    parse_static_endpoints,
)
from kvpool.domain.revision import revision_of

if TYPE_CHECKING:
    from kvpool.controller.context import Operator

log = logging.getLogger(__name__)


def _pool_inputs(op: Operator, namespace: str) -> list[PoolInput]:
    inputs = []
    for body in list(op.cache.pools.get(namespace, {}).values()):
        meta = body.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        try:
            pool = op.cache.parsed(ModelPool, body)
        except pydantic.ValidationError:
            continue
        status = op.statuses.get((namespace, pool.metadata.name)) or prior_status(
            op, (namespace, pool.metadata.name), body
        )
        static = pool.metadata.annotations.get(m.ANNOTATION_STATIC_ENDPOINTS)
        pods: list[PodView] = list(op.cache.pods.get((namespace, pool.metadata.name), {}).values())
        endpoints = (
            parse_static_endpoints(static)
            if static
            else build_endpoints(pods, pool.spec.engine.port, "stable")
        )
        inputs.append(
            PoolInput(
                pool=pool,
                plan=status.plan if status is not None else None,
                revision=stable_revision_of(status, revision_of(pool.spec)),
                endpoints=endpoints,
                canary=build_canary_input(pool, status, pods),
            )
        )
    return inputs


def _tenant_inputs(op: Operator, namespace: str) -> list[TenantInput]:
    inputs = []
    for body in list(op.cache.budgets.get(namespace, {}).values()):
        try:
            budget = op.cache.parsed(TenantBudget, body)
        except pydantic.ValidationError:
            continue
        ref = budget.spec.api_key_secret_ref
        hashes = op.cache.secrets.get((namespace, ref.name), {})
        inputs.append(TenantInput(budget=budget, key_sha256=hashes.get(ref.key)))
    return inputs


def _policies(op: Operator, namespace: str) -> list[TierPolicy]:
    policies = []
    for body in list(op.cache.policies.get(namespace, {}).values()):
        try:
            policies.append(op.cache.parsed(TierPolicy, body))
        except pydantic.ValidationError:
            continue
    return policies


async def publish_namespace(op: Operator, namespace: str) -> None:
    """Compile the namespace's config and write the ConfigMap when its content changed."""
    compiled = build_admission_config(
        namespace,
        _pool_inputs(op, namespace),
        _policies(op, namespace),
        _tenant_inputs(op, namespace),
        generated_at=utc_now(),
    )
    for budget, reason in compiled.skipped:
        log.info("TenantBudget %s/%s left out of the config: %s", namespace, budget, reason)
    digest = config_hash(compiled.config)
    desired = m.build_admission_configmap(namespace, compiled.config.to_json(), digest)
    try:
        action = await kube.apply_admission_configmap(op.kube, desired)
    except kube.ApiError:
        op.metrics.errors.labels("publish").inc()
        raise
    op.metrics.publishes.labels(action).inc()
    # Policy and budget statuses follow in the background: thousands of tenants must not
    # delay the next config publication.
    task = asyncio.create_task(op.side_statuses.request(namespace))
    op.background.add(task)
    task.add_done_callback(lambda done: _finished(op, done))


def _finished(op: Operator, task: asyncio.Task[None]) -> None:
    op.background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        op.metrics.errors.labels("status").inc()
        log.warning("status update failed: %r", task.exception())
