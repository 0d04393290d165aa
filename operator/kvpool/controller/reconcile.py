"""Reconciling one ModelPool, and publishing a namespace's compiled admission config.

Why it exists: this is the orchestration layer, kept short on purpose. Each function
observes (Kubernetes, Prometheus), hands the observations to a pure decision in
``kvpool.domain``, applies the result through ``kvpool.adapters`` and records the outcome
in ``status`` and Events:

    observe pool + policy + metrics -> assess capacity -> plan -> decide warm replicas
    -> apply Deployment, Service, PDB -> status (+ Events) -> publish the namespace config

Fail-static: when Prometheus is unreachable or returns nothing, the last measurement is
kept (so the plan is kept) and warm replicas never drop below the last count because
metrics vanished. A missing TierPolicy touches no child object.

Restart safety: child names are deterministic and creation falls back to patching on 409,
so an operator killed mid-reconcile and restarted converges without duplicates.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from kvpool.adapters import kube
from kvpool.adapters.prometheus import MetricsSnapshot, PrometheusUnavailable, SnapshotCache
from kvpool.api.modelpool import LoadStatus, ModelPool, ModelPoolStatus
from kvpool.api.tenantbudget import TenantBudget, TenantBudgetStatus
from kvpool.api.tierpolicy import TierPolicy, TierPolicyStatus
from kvpool.controller.cache import Cache
from kvpool.controller.config import OperatorConfig
from kvpool.controller.metrics import OperatorMetrics
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
from kvpool.domain.measurement import (
    METRICS_OFF,
    METRICS_OK,
    NO_DATA,
    PROMETHEUS_DOWN,
    MetricsState,
    ReplicaReading,
    assess_capacity,
    decide_warm_replicas,
)
from kvpool.domain.planner import PlanError, PoolPlan, plan_pool
from kvpool.domain.pool_status import (
    PoolObservation,
    build_budget_status,
    build_missing_policy_status,
    build_policy_status,
    build_pool_status,
    plan_events,
)
from kvpool.domain.revision import revision_of

log = logging.getLogger(__name__)

Body = Mapping[str, Any]


def utc_now() -> str:
    """The current time in RFC 3339 (seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Coalescer:
    """Runs ``fn(key)`` at most once at a time per key; requests made while a run is
    waiting are served by that run (a burst of triggers costs one or two runs)."""

    def __init__(self, fn: Callable[[Any], Awaitable[None]]) -> None:
        self.fn = fn
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._requested: dict[Hashable, int] = {}
        self._covered: dict[Hashable, int] = {}

    async def request(self, key: Hashable) -> None:
        ticket = self._requested[key] = self._requested.get(key, 0) + 1
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self._covered.get(key, 0) >= ticket:
                return  # a run that started after this request already saw its cause
            self._covered[key] = self._requested[key]
            try:
                await self.fn(key)
            except BaseException:
                self._covered[key] = ticket - 1
                raise


@dataclass
class Operator:
    """Everything the handlers share: clients, cache, metrics, last statuses."""

    config: OperatorConfig
    kube: kube.KubeClient
    snapshots: SnapshotCache
    metrics: OperatorMetrics
    cache: Cache = field(default_factory=Cache)
    statuses: dict[tuple[str, str], ModelPoolStatus] = field(default_factory=dict)
    written: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    pools: Coalescer = field(init=False)
    publisher: Coalescer = field(init=False)
    side_statuses: Coalescer = field(init=False)
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.pools = Coalescer(lambda key: reconcile_pool(self, *key))
        self.publisher = Coalescer(lambda ns: publish_namespace(self, ns))
        self.side_statuses = Coalescer(lambda ns: apply_side_statuses(self, ns))


# --- observe ---------------------------------------------------------------------------------


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


def _resource(body: Body) -> dict[str, Any]:
    """A plain dict of an object without the fields our models do not describe."""
    return {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in body}


def _prior_status(op: Operator, key: tuple[str, str], body: Body) -> ModelPoolStatus | None:
    if key in op.statuses:
        return op.statuses[key]
    try:
        return ModelPoolStatus.model_validate(body.get("status") or {})
    except pydantic.ValidationError:
        return None


# --- reconcile -------------------------------------------------------------------------------


async def reconcile_pool(op: Operator, namespace: str, name: str) -> None:
    """observe -> plan -> apply -> status for one pool (see the module docstring)."""
    started = time.monotonic()
    key = (namespace, name)
    try:
        body = await op.kube.get(kube.MODELPOOLS, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            await cleanup_pool(op, namespace, name)
            return
        prior = _prior_status(op, key, body)
        try:
            pool = ModelPool.model_validate(_resource(body) | {"status": None})
        except pydantic.ValidationError as exc:
            await _write_status(op, body, prior, _invalid_status(prior, body, exc))
            return
        policy = await observe_policy(op, namespace, pool.spec.tier_policy_ref.name)
        if policy is None:
            status = build_missing_policy_status(
                prior, pool.metadata.generation, pool.spec.tier_policy_ref.name, utc_now()
            )
            op.metrics.plans.labels(c.TIER_POLICY_NOT_FOUND).inc()
            await _write_status(op, body, prior, status)
        else:
            await _plan_and_apply(op, body, pool, policy, prior)
        op.metrics.reconciles.labels("ok").inc()
    except Exception:
        op.metrics.reconciles.labels("error").inc()
        op.metrics.errors.labels("reconcile").inc()
        raise
    finally:
        op.metrics.reconcile_seconds.observe(time.monotonic() - started)
    await op.publisher.request(namespace)


async def _plan_and_apply(
    op: Operator, body: Body, pool: ModelPool, policy: TierPolicy, prior: ModelPoolStatus | None
) -> None:
    namespace, name = pool.metadata.namespace or "default", pool.metadata.name
    now, revision = utc_now(), revision_of(pool.spec)
    metrics, metrics_message, readings, load = await observe_metrics(op, namespace, name, revision)
    declared = pool.spec.capacity.kv_tokens_per_replica
    previous = prior.capacity if prior is not None else None
    assessment = assess_capacity(readings, metrics, previous, revision, declared, now)
    plan = plan_pool(pool, policy, assessment.kv_tokens)
    warm = _warm_replicas(pool, plan, prior, metrics)
    op.metrics.plans.labels("Planned" if isinstance(plan, PoolPlan) else plan.reason).inc()
    op.metrics.warm_replicas.labels(namespace, name).set(warm)

    deployment = await _apply_children(op, pool, revision, warm)
    static = pool.metadata.annotations.get(m.ANNOTATION_STATIC_ENDPOINTS)
    ready = (
        len(parse_static_endpoints(static))
        if static
        else int((deployment.get("status") or {}).get("readyReplicas") or 0)
    )
    observation = PoolObservation(
        generation=pool.metadata.generation,
        revision=revision,
        assessment=assessment,
        plan=plan,
        warm_replicas=warm,
        ready_replicas=ready,
        metrics=metrics,
        metrics_message=metrics_message,
        load=_keep_load_time(load, prior),
        now=now,
    )
    status = build_pool_status(prior, observation, declared)
    await _write_status(op, body, prior, status, assessment)


def _warm_replicas(
    pool: ModelPool,
    plan: PoolPlan | PlanError,
    prior: ModelPoolStatus | None,
    metrics: MetricsState,
) -> int:
    """The plan's replicas (fail-static guarded); without a plan, keep what runs so the
    engines can be measured (at least minReplicas, at least one)."""
    capacity = pool.spec.capacity
    last = prior.replicas.desired if prior is not None and prior.replicas is not None else None
    if isinstance(plan, PlanError):
        wanted = last if last else max(capacity.min_replicas, 1)
        return min(wanted, capacity.max_replicas)
    spec_changed = prior is None or prior.observed_generation != pool.metadata.generation
    warm = decide_warm_replicas(plan.replicas, last, metrics, spec_changed)
    return min(warm, capacity.max_replicas)


def _keep_load_time(load: LoadStatus | None, prior: ModelPoolStatus | None) -> LoadStatus | None:
    """Keep ``observedAt`` while the values are unchanged (no status write per tick)."""
    if load is None or prior is None or prior.load is None:
        return load
    if load.model_copy(update={"observed_at": None}) == prior.load.model_copy(
        update={"observed_at": None}
    ):
        return prior.load
    return load


async def _apply_children(
    op: Operator, pool: ModelPool, revision: str, warm: int
) -> kube.JsonObject:
    """Deployment, Service and PDB of the stable track; returns the Deployment."""
    deployment, _ = await kube.apply_deployment(
        op.kube, m.build_deployment(pool, revision, warm, "stable")
    )
    await _testing_pause(op)
    await kube.apply_service(op.kube, m.build_service(pool, "stable"))
    await _testing_pause(op)
    await kube.apply_pdb(op.kube, m.build_pdb(pool, warm))
    return deployment


async def _testing_pause(op: Operator) -> None:
    if op.config.apply_delay > 0:
        await asyncio.sleep(op.config.apply_delay)


def _invalid_status(prior: ModelPoolStatus | None, body: Body, exc: Exception) -> ModelPoolStatus:
    prior = prior or ModelPoolStatus()
    generation = (body.get("metadata") or {}).get("generation")
    message = f"spec does not parse: {str(exc).splitlines()[0]}"
    conds = c.set_condition(
        prior.conditions, c.READY, "False", c.INVALID_SPEC, message, generation, utc_now()
    )
    return prior.model_copy(
        update={"observed_generation": generation, "phase": "Error", "conditions": conds}
    )


async def _write_status(
    op: Operator,
    body: Body,
    prior: ModelPoolStatus | None,
    status: ModelPoolStatus,
    assessment: Any = None,
) -> None:
    """Patch ``status`` when it changed, remember it, and emit the Events it implies."""
    meta = body["metadata"]
    key = (meta.get("namespace") or "default", meta["name"])
    if prior is None or prior.to_wire() != status.to_wire():
        await kube.apply_status(op.kube, kube.MODELPOOLS, key[0], key[1], status.to_wire())
        for event in plan_events(prior, status, assessment):
            await kube.create_event(
                op.kube, body, event.type, event.reason, event.message, utc_now()
            )
    op.statuses[key] = status  # only once written: a failed write is retried next time
    op.metrics.record_conditions(*key, ((c.type, c.status) for c in status.conditions))


async def cleanup_pool(op: Operator, namespace: str, name: str) -> None:
    """Remove a deleted pool's children (ownerReferences do this in a real cluster)."""
    deleted = await kube.delete_children(op.kube, namespace, name)
    op.statuses.pop((namespace, name), None)
    op.metrics.forget_pool(namespace, name)
    if deleted:
        log.info("pool %s/%s deleted: removed %d children", namespace, name, deleted)


# --- publish ---------------------------------------------------------------------------------


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
        status = op.statuses.get((namespace, pool.metadata.name)) or _prior_status(
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
                revision=revision_of(pool.spec),
                endpoints=endpoints,
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


async def apply_side_statuses(op: Operator, namespace: str) -> None:
    """TierPolicy and TenantBudget statuses of a namespace (pools using it, key resolved)."""
    await _apply_policy_statuses(op, namespace)
    await _apply_budget_statuses(op, namespace)


async def _apply_aux_status(
    op: Operator, resource: kube.Resource, body: Body, status: dict[str, Any]
) -> None:
    """Patch a TierPolicy/TenantBudget status unless it already says this."""
    meta = body["metadata"]
    key = (resource.plural, meta.get("namespace") or "default", meta["name"])
    if op.written.get(key) == status or body.get("status") == status:
        return
    await kube.apply_status(op.kube, resource, key[1], key[2], status)
    op.written[key] = status


async def _apply_policy_statuses(op: Operator, namespace: str) -> None:
    pools = list(op.cache.pools.get(namespace, {}).values())
    for body in list(op.cache.policies.get(namespace, {}).values()):
        name = body["metadata"]["name"]
        using = sum(
            1
            for p in pools
            if ((p.get("spec") or {}).get("tierPolicyRef") or {}).get("name") == name
        )
        prior = _parse_or_none(TierPolicyStatus, body.get("status"))
        status = build_policy_status(prior, body["metadata"].get("generation"), using, utc_now())
        await _apply_aux_status(op, kube.TIERPOLICIES, body, status.to_wire())


async def _apply_budget_statuses(op: Operator, namespace: str) -> None:
    for body in list(op.cache.budgets.get(namespace, {}).values()):
        ref = ((body.get("spec") or {}).get("apiKeySecretRef")) or {}
        secret, key = str(ref.get("name", "")), str(ref.get("key", ""))
        resolved = key in op.cache.secrets.get((namespace, secret), {})
        prior = _parse_or_none(TenantBudgetStatus, body.get("status"))
        status = build_budget_status(
            prior, body["metadata"].get("generation"), secret, key, resolved, utc_now()
        )
        await _apply_aux_status(op, kube.TENANTBUDGETS, body, status.to_wire())


def _parse_or_none(model: Any, raw: Any) -> Any:
    try:
        return model.model_validate(raw) if raw else None
    except pydantic.ValidationError:
        return None
