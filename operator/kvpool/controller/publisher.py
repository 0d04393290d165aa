"""Publishing a namespace's compiled admission config (ConfigMap ``kvpool-admission``).

Why it exists: the gateway enforces one compiled config per namespace, built from every
pool's plan and endpoints, every TierPolicy and every tenant with a resolved key. This
module gathers those inputs from the cache (no API reads per publish), hands them to the
pure compiler (:func:`kvpool.domain.compile.build_admission_config`) and writes the
ConfigMap only when the config hash changed. A large config (thousands of tenants) is
published as an index and tenant shards (:mod:`kvpool.domain.config_shards`), so no
object nears the API server's 1 MiB limit; a publish that would still exceed it is
refused with an error naming the object, and one near it is logged (the gauge
``kvpool_operator_admission_config_largest_object_bytes`` shows the margin).

Only what passes the checks of ``kvpool validate`` (:mod:`kvpool.domain.validity`) is
compiled. Fail-static (:mod:`kvpool.domain.fail_static`): the last published entry of a
TierPolicy that became invalid or was deleted while still referenced, and of a ModelPool
whose spec became invalid, is kept with ``stale: true``, so the gateway keeps serving.

The TierPolicy/TenantBudget statuses that follow a publish are requested in the
background by the composition root (:mod:`.wiring`, then :mod:`.side_statuses`), so
thousands of tenants never delay the next publication.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pydantic

from kvpool.adapters import kube
from kvpool.api.admission_config import (
    CONFIGMAP_KEY,
    CONFIGMAP_NAME,
    SHARD_NAME_PREFIX,
    SHARD_TENANTS_KEY,
    SHARDS_KEY,
    AdmissionConfig,
    ShardIndex,
)
from kvpool.api.modelpool import ModelPool, ModelPoolStatus
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller import apply
from kvpool.controller.cache import Cache
from kvpool.controller.clock import rfc3339_ms
from kvpool.controller.local_mode import StaticEndpoints
from kvpool.controller.observe import assess_cached_namespace, key_digests, prior_status
from kvpool.controller.rollout import build_canary_input, stable_revision_of
from kvpool.controller.state import OperatorState, PoolKey
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
from kvpool.domain.config_shards import (
    OBJECT_LIMIT_BYTES,
    SizeVerdict,
    assess_sizes,
    plan_shards,
)
from kvpool.domain.fail_static import keep_last_good
from kvpool.domain.revision import revision_of
from kvpool.domain.validity import NamespaceVerdicts

log = logging.getLogger(__name__)

# TenantBudget verdicts that leave the tenant out of the config (the others publish it
# against the last valid version of its policy)
UNPUBLISHED = frozenset({c.INVALID_SPEC, c.DUPLICATE_API_KEY})


def _pool_input(
    pool: ModelPool,
    status: ModelPoolStatus | None,
    pods: list[PodView],
    static: StaticEndpoints,
) -> PoolInput:
    """One pool's part of the config: its plan, revision and both tracks' endpoints."""
    stable_static = static.of(pool)
    endpoints = (
        parse_static_endpoints(stable_static)
        if stable_static
        else build_endpoints(pods, pool.spec.engine.port, "stable")
    )
    canary_static = static.of(pool, m.ANNOTATION_CANARY_STATIC_ENDPOINTS)
    return PoolInput(
        pool=pool,
        plan=status.plan if status is not None else None,
        revision=stable_revision_of(status, revision_of(pool.spec)),
        endpoints=endpoints,
        canary=build_canary_input(pool, status, pods, canary_static),
    )


def _pool_inputs(
    cache: Cache,
    statuses: Mapping[PoolKey, ModelPoolStatus],
    static: StaticEndpoints,
    namespace: str,
    verdicts: NamespaceVerdicts,
) -> list[PoolInput]:
    """Pools whose own spec is usable (valid, or waiting for their TierPolicy)."""
    inputs = []
    for body in list(cache.pools.get(namespace, {}).values()):
        meta = body.get("metadata") or {}
        verdict = verdicts.pools.get(meta.get("name", ""))
        if meta.get("deletionTimestamp") or verdict is None or verdict.reason == c.INVALID_SPEC:
            continue
        pool: ModelPool | None = cache.checked(body).model
        if pool is None:
            continue
        key = (namespace, pool.metadata.name)
        status = prior_status(statuses, key, body)
        pods: list[PodView] = list(cache.pods.get(key, {}).values())
        inputs.append(_pool_input(pool, status, pods, static))
    return inputs


def _tenant_inputs(cache: Cache, namespace: str, verdicts: NamespaceVerdicts) -> list[TenantInput]:
    """Budgets whose own spec is usable (valid, or waiting for their TierPolicy) and whose
    API key is theirs alone."""
    inputs = []
    for body in list(cache.budgets.get(namespace, {}).values()):
        verdict = verdicts.budgets.get((body.get("metadata") or {}).get("name", ""))
        budget: TenantBudget | None = cache.checked(body).model
        if verdict is None or verdict.reason in UNPUBLISHED or budget is None:
            continue
        digests = tuple(key_digests(cache, namespace, budget))
        inputs.append(TenantInput(budget=budget, key_sha256s=digests))
    return inputs


def _policies(cache: Cache, namespace: str) -> list[TierPolicy]:
    """Valid TierPolicies (one being deleted while in use is still valid)."""
    policies = []
    for body in list(cache.policies.get(namespace, {}).values()):
        policy: TierPolicy | None = cache.checked(body).model
        if policy is not None:
            policies.append(policy)
    return policies


def _held(
    cache: Cache, namespace: str, verdicts: NamespaceVerdicts
) -> tuple[dict[str, str], dict[str, str]]:
    """Policies and pools whose last published entry must be kept (name -> why)."""
    policies = {
        name: f"TierPolicy is invalid: {v.message}"
        for name, v in verdicts.policies.items()
        if not v.valid
    }
    for body in [
        *cache.pools.get(namespace, {}).values(),
        *cache.budgets.get(namespace, {}).values(),
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


async def _previous(
    client: kube.KubeClient, published: dict[str, AdmissionConfig | None], namespace: str
) -> AdmissionConfig | None:
    """The config last published in this namespace (read once per process)."""
    if namespace not in published:
        body = await client.get(kube.CONFIGMAPS, namespace, CONFIGMAP_NAME)
        text = ((body or {}).get("data") or {}).get(CONFIGMAP_KEY)
        try:
            published[namespace] = AdmissionConfig.model_validate_json(text) if text else None
        except pydantic.ValidationError:
            log.warning("the published config of %s does not parse; not keeping it", namespace)
            published[namespace] = None
    return published[namespace]


async def publish_namespace(state: OperatorState, namespace: str) -> None:
    """Compile the namespace's valid objects (plus the last good entries of those gone
    bad) and write the ConfigMap when its content changed."""
    cache = state.cache
    verdicts = assess_cached_namespace(cache, namespace)
    compiled = build_admission_config(
        namespace,
        _pool_inputs(cache, state.statuses, state.static, namespace, verdicts),
        _policies(cache, namespace),
        _tenant_inputs(cache, namespace, verdicts),
        generated_at=rfc3339_ms(state.clock),
    )
    for budget, reason in compiled.skipped:
        log.info("TenantBudget %s/%s left out of the config: %s", namespace, budget, reason)
    held_policies, held_pools = _held(cache, namespace, verdicts)
    previous = await _previous(state.kube, state.published, namespace)
    config = keep_last_good(compiled.config, previous, held_policies, held_pools)
    try:
        action, verdict = await apply_admission_config(state.kube, namespace, config)
    except (kube.ApiError, ConfigTooLargeError):
        state.metrics.errors.labels("publish").inc()
        raise
    state.published[namespace] = config
    state.metrics.publishes.labels(action).inc()
    state.metrics.config_largest_object.labels(namespace).set(verdict.largest_bytes)


async def _published_shards(client: kube.KubeClient, namespace: str) -> set[str]:
    """The tenant shards the index now published names (to delete those it no longer will)."""
    body = await client.get(kube.CONFIGMAPS, namespace, CONFIGMAP_NAME)
    text = ((body or {}).get("data") or {}).get(SHARDS_KEY)
    try:
        index = ShardIndex.model_validate_json(text) if text else None
    except pydantic.ValidationError:
        return set()
    names = {ref.name for ref in index.tenant_shards} if index is not None else set()
    return {name for name in names if name.startswith(SHARD_NAME_PREFIX)}


class ConfigTooLargeError(Exception):
    """A ConfigMap of the compiled config would exceed the API server's 1 MiB limit."""


async def apply_admission_config(
    client: kube.KubeClient, namespace: str, config: AdmissionConfig
) -> tuple[str, SizeVerdict]:
    """Write ``config`` as one ConfigMap, or as an index and tenant shards when large
    (:mod:`kvpool.domain.config_shards`); returns the index's action and the size verdict.

    Order: new shards first, then the index that names them, then the shards the
    previous index named and this one does not are deleted, so a gateway reading at any
    moment finds a consistent set (or a 404 for a shard just deleted, and reads again).
    Refuses (before writing anything) when an object would exceed 1 MiB; warns when one
    is above 900 KiB.
    """
    generation = config_hash(config)
    sharded = plan_shards(config, generation)
    shards_json = sharded.shard_index.to_json() if sharded.shard_index is not None else None
    desired = m.build_admission_configmap(namespace, sharded.index_text, generation, shards_json)
    objects = {CONFIGMAP_NAME: desired["data"]}
    for shard in sharded.shards:
        objects[shard.name] = {SHARD_TENANTS_KEY: shard.text}
    verdict = assess_sizes(objects)
    if not verdict.publishable:
        log.error(
            "the admission config of %s is not published: ConfigMap %s would hold %d bytes, "
            "over the API server's limit of %d (the index holds every pool and tier policy "
            "of the namespace: split the pools over more namespaces)",
            namespace, verdict.largest, verdict.largest_bytes, OBJECT_LIMIT_BYTES,
        )  # fmt: skip
        raise ConfigTooLargeError(
            f"ConfigMap {namespace}/{verdict.largest}: {verdict.largest_bytes} bytes, over "
            f"the {OBJECT_LIMIT_BYTES}-byte limit"
        )
    if verdict.verdict == "near":
        log.warning(
            "the admission config of %s is near the ConfigMap limit: %s holds %d bytes "
            "(limit %d)",
            namespace, verdict.largest, verdict.largest_bytes, OBJECT_LIMIT_BYTES,
        )  # fmt: skip
    for shard in sharded.shards:
        await apply.apply_tenant_shard(
            client, m.build_tenant_shard_configmap(namespace, shard.name, shard.text)
        )
    before = await _published_shards(client, namespace)
    action = await apply.apply_admission_configmap(client, desired)
    for name in sorted(before - {shard.name for shard in sharded.shards}):
        await client.delete(kube.CONFIGMAPS, namespace, name)
    if sharded.shards and action != "unchanged":
        log.info(
            "admission config of %s published as %d tenant shards (largest object %s: %d "
            "bytes)", namespace, len(sharded.shards), verdict.largest, verdict.largest_bytes,
        )  # fmt: skip
    return action, verdict
