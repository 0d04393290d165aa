"""Publishing a namespace's compiled admission config (ConfigMap ``kvpool-admission``).

Why it exists: the gateway enforces one compiled config per namespace, built from every
pool's plan and endpoints, every TierPolicy and every tenant with a resolved key. This
module gathers those inputs from the cache (no API reads per publish), hands them to the
pure compiler (:func:`kvpool.domain.compile.build_admission_config`) and writes the
ConfigMap only when the config hash changed.

Only what passes the checks of ``kvpool validate`` (:mod:`kvpool.domain.validity`) is
compiled. Fail-static (:mod:`kvpool.domain.fail_static`): the last published entry of a
TierPolicy that became invalid or was deleted while still referenced, and of a ModelPool
whose spec became invalid, is kept with ``stale: true``, so the gateway keeps serving.

The TierPolicy/TenantBudget statuses that follow a publish are requested in the
background (:mod:`.side_statuses`), so thousands of tenants never delay the next
publication.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import pydantic

from kvpool.adapters import kube
from kvpool.api.admission_config import CONFIGMAP_KEY, CONFIGMAP_NAME, AdmissionConfig
from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller.clock import utc_now
from kvpool.controller.observe import assess_cached_namespace, prior_status, static_endpoints
from kvpool.controller.rollout import (
    ANNOTATION_CANARY_STATIC_ENDPOINTS,
    build_canary_input,
    stable_revision_of,
)
from kvpool.domain import conditions as c
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
from kvpool.domain.fail_static import keep_last_good
from kvpool.domain.revision import revision_of
from kvpool.domain.validity import NamespaceVerdicts

if TYPE_CHECKING:
    from kvpool.controller.context import Operator

log = logging.getLogger(__name__)


def _pool_inputs(op: Operator, namespace: str, verdicts: NamespaceVerdicts) -> list[PoolInput]:
    """Pools whose own spec is usable (valid, or waiting for their TierPolicy)."""
    inputs = []
    for body in list(op.cache.pools.get(namespace, {}).values()):
        meta = body.get("metadata") or {}
        verdict = verdicts.pools.get(meta.get("name", ""))
        if meta.get("deletionTimestamp") or verdict is None or verdict.reason == c.INVALID_SPEC:
            continue
        pool: ModelPool | None = op.cache.checked(body).model
        if pool is None:
            continue
        status = op.statuses.get((namespace, pool.metadata.name)) or prior_status(
            op, (namespace, pool.metadata.name), body
        )
        static = static_endpoints(op, pool)
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
                canary=build_canary_input(
                    pool,
                    status,
                    pods,
                    static_endpoints(op, pool, ANNOTATION_CANARY_STATIC_ENDPOINTS),
                ),
            )
        )
    return inputs


def _tenant_inputs(op: Operator, namespace: str, verdicts: NamespaceVerdicts) -> list[TenantInput]:
    """Budgets whose own spec is usable (valid, or waiting for their TierPolicy)."""
    inputs = []
    for body in list(op.cache.budgets.get(namespace, {}).values()):
        verdict = verdicts.budgets.get((body.get("metadata") or {}).get("name", ""))
        budget: TenantBudget | None = op.cache.checked(body).model
        if verdict is None or verdict.reason == c.INVALID_SPEC or budget is None:
            continue
        ref = budget.spec.api_key_secret_ref
        hashes = op.cache.secrets.get((namespace, ref.name), {})
        inputs.append(TenantInput(budget=budget, key_sha256=hashes.get(ref.key)))
    return inputs


def _policies(op: Operator, namespace: str) -> list[TierPolicy]:
    """Valid TierPolicies (one being deleted while in use is still valid)."""
    policies = []
    for body in list(op.cache.policies.get(namespace, {}).values()):
        policy: TierPolicy | None = op.cache.checked(body).model
        if policy is not None:
            policies.append(policy)
    return policies


def _held(
    op: Operator, namespace: str, verdicts: NamespaceVerdicts
) -> tuple[dict[str, str], dict[str, str]]:
    """Policies and pools whose last published entry must be kept (name -> why)."""
    policies = {
        name: f"TierPolicy is invalid: {v.message}"
        for name, v in verdicts.policies.items()
        if not v.valid
    }
    for body in [
        *op.cache.pools.get(namespace, {}).values(),
        *op.cache.budgets.get(namespace, {}).values(),
    ]:
        ref = ((body.get("spec") or {}).get("tierPolicyRef") or {}).get("name")
        if isinstance(ref, str) and ref not in verdicts.policies:
            policies[ref] = "TierPolicy not found (deleted while in use?)"
    pools = {
        name: f"ModelPool spec is invalid: {v.message}"
        for name, v in verdicts.pools.items()
        if v.reason == c.INVALID_SPEC
    }
    return policies, pools


async def _previous(op: Operator, namespace: str) -> AdmissionConfig | None:
    """The config last published in this namespace (read once per process)."""
    if namespace not in op.published:
        body = await op.kube.get(kube.CONFIGMAPS, namespace, CONFIGMAP_NAME)
        text = ((body or {}).get("data") or {}).get(CONFIGMAP_KEY)
        try:
            op.published[namespace] = AdmissionConfig.model_validate_json(text) if text else None
        except pydantic.ValidationError:
            log.warning("the published config of %s does not parse; not keeping it", namespace)
            op.published[namespace] = None
    return op.published[namespace]


async def publish_namespace(op: Operator, namespace: str) -> None:
    """Compile the namespace's valid objects (plus the last good entries of those gone
    bad) and write the ConfigMap when its content changed."""
    verdicts = assess_cached_namespace(op, namespace)
    compiled = build_admission_config(
        namespace,
        _pool_inputs(op, namespace, verdicts),
        _policies(op, namespace),
        _tenant_inputs(op, namespace, verdicts),
        generated_at=utc_now(),
    )
    for budget, reason in compiled.skipped:
        log.info("TenantBudget %s/%s left out of the config: %s", namespace, budget, reason)
    held_policies, held_pools = _held(op, namespace, verdicts)
    config = keep_last_good(
        compiled.config, await _previous(op, namespace), held_policies, held_pools
    )
    digest = config_hash(config)
    desired = m.build_admission_configmap(namespace, config.to_json(), digest)
    try:
        action = await kube.apply_admission_configmap(op.kube, desired)
    except kube.ApiError:
        op.metrics.errors.labels("publish").inc()
        raise
    op.published[namespace] = config
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
