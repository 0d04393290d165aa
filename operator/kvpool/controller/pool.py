"""Reconciling one ModelPool: observe -> plan -> apply children -> status (+ Events).

Why it exists: this is the orchestration of one pool, kept short on purpose. Each step
observes (Kubernetes, Prometheus; :mod:`.observe`), hands the observations to a pure
decision in ``kvpool.domain``, applies the result through ``kvpool.adapters`` and records
the outcome in ``status`` and Events:

    observe pool + policy + metrics -> check (kvpool validate's checks, domain/validity)
    -> assess capacity -> plan -> decide warm replicas
    -> rollout (controller/rollout.py: canary children, status.rollout)
    -> apply Deployment, Service, PDB -> status (+ Events) -> request a config publish

Fail-static: when Prometheus is unreachable or returns nothing, the last measurement is
kept (so the plan is kept) and warm replicas never drop below the last count because
metrics vanished. An invalid spec, or a TierPolicy missing or invalid, touches no child
object: the status says why (``Ready=False`` with every field path and reason), a Warning
Event is posted, and the last good plan stays published (``ConfigStale=True``).

Restart safety: child names are deterministic and creation falls back to patching on 409,
so an operator killed mid-reconcile and restarted converges without duplicates.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvpool.adapters import kube
from kvpool.api.modelpool import ModelPool, ModelPoolStatus
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller.cache import check_object
from kvpool.controller.clock import utc_now
from kvpool.controller.observe import (
    checked_objects,
    observe_metrics,
    observe_policy,
    prior_status,
    static_endpoints,
)
from kvpool.controller.rollout import reconcile_rollout, scale_stable, stable_revision_of
from kvpool.domain import manifests as m
from kvpool.domain.compile import parse_static_endpoints
from kvpool.domain.measurement import assess_capacity, decide_pool_warm_replicas
from kvpool.domain.planner import PoolPlan, plan_pool
from kvpool.domain.pool_status import (
    PoolObservation,
    build_blocked_status,
    build_pool_status,
    keep_load_time,
    plan_events,
)
from kvpool.domain.revision import revision_of
from kvpool.domain.rollout.machine import to_rfc3339
from kvpool.domain.rollout.status import build_rollout_status
from kvpool.domain.validity import Checked, Verdict, assess_pool, served_names

if TYPE_CHECKING:
    from kvpool.controller.context import Operator

log = logging.getLogger(__name__)

EVENT_DRIFT = "DriftRestored"  # a child's owned fields were edited by hand and put back

Body = Mapping[str, Any]


async def reconcile_pool(op: Operator, namespace: str, name: str) -> None:
    """observe -> check -> plan -> apply -> status for one pool (see the module docstring)."""
    started = time.monotonic()
    key = (namespace, name)
    try:
        body = await op.kube.get(kube.MODELPOOLS, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            await cleanup_pool(op, namespace, name)
            return
        prior = prior_status(op, key, body)
        verdict, pool, policy = await _assess(op, namespace, body)
        if pool is not None and policy is not None:
            await _plan_and_apply(op, body, pool, policy, prior)
        else:
            generation = (body.get("metadata") or {}).get("generation")
            status = build_blocked_status(
                prior, generation, verdict.reason, verdict.message, utc_now()
            )
            op.metrics.plans.labels(verdict.reason).inc()
            await write_status(op, body, prior, status)
        op.metrics.reconciles.labels("ok").inc()
    except Exception:
        op.metrics.reconciles.labels("error").inc()
        op.metrics.errors.labels("reconcile").inc()
        raise
    finally:
        op.metrics.reconcile_seconds.observe(time.monotonic() - started)
    await op.publisher.request(namespace)


async def _assess(
    op: Operator, namespace: str, body: Body
) -> tuple[Verdict, ModelPool | None, TierPolicy | None]:
    """The checks of ``kvpool validate`` for this pool as read just now: its own, then
    against its TierPolicy and the served names of the namespace's other pools. The
    pool and policy are returned only when the verdict allows acting on them."""
    checked: Checked[ModelPool] = check_object(body)
    policy = None
    if checked.model is not None:
        policy = await observe_policy(op, namespace, checked.model.spec.tier_policy_ref.name)
    others = [p for p in checked_objects(op, op.cache.pools, namespace) if p.name != checked.name]
    verdict = assess_pool(checked, policy, served_names([*others, checked]))
    if not verdict.valid or checked.model is None or policy is None or policy.model is None:
        return verdict, None, None
    return verdict, checked.model, policy.model


async def _plan_and_apply(
    op: Operator, body: Body, pool: ModelPool, policy: TierPolicy, prior: ModelPoolStatus | None
) -> None:
    namespace, name = pool.metadata.namespace or "default", pool.metadata.name
    moment = datetime.datetime.now(datetime.UTC)
    now, spec_revision = to_rfc3339(moment), revision_of(pool.spec)
    # capacity is planned on the revision stable runs (a canary is planned on its own)
    revision = stable_revision_of(prior, spec_revision)
    metrics, metrics_message, readings, load = await observe_metrics(op, namespace, name, revision)
    declared = pool.spec.capacity.kv_tokens_per_replica
    previous = prior.capacity if prior is not None else None
    assessment = assess_capacity(readings, metrics, previous, revision, declared, now)
    plan = plan_pool(pool, policy, assessment.kv_tokens)
    warm = decide_pool_warm_replicas(pool, plan, prior, metrics)
    op.metrics.plans.labels("Planned" if isinstance(plan, PoolPlan) else plan.reason).inc()
    op.metrics.warm_replicas.labels(namespace, name).set(warm)

    rollout = await reconcile_rollout(
        op, pool, policy, prior, spec_revision, assessment.kv_tokens, warm, moment
    )
    pin = rollout.actions.pin_stable
    deployment = await _apply_children(op, body, pool, spec_revision, warm, pin)
    static = static_endpoints(op, pool)
    ready = (
        len(parse_static_endpoints(static))
        if static
        else int((deployment.get("status") or {}).get("readyReplicas") or 0)
    )
    observation = PoolObservation(
        generation=pool.metadata.generation,
        revision=spec_revision,
        assessment=assessment,
        plan=plan,
        warm_replicas=warm,
        ready_replicas=ready,
        metrics=metrics,
        metrics_message=metrics_message,
        load=keep_load_time(load, prior),
        now=now,
        tokenizer_path=pool.spec.model.tokenizer_path,
    )
    status = build_pool_status(prior, observation, declared)
    status = build_rollout_status(
        status, rollout.status, rollout.canary_ready, pool.metadata.generation, now
    )
    await write_status(op, body, prior, status, assessment)
    for event in rollout.decision.events:
        await kube.create_event(op.kube, body, event.type, event.reason, event.message, now)


async def _apply_children(
    op: Operator, body: Body, pool: ModelPool, revision: str, warm: int, pin: bool
) -> kube.JsonObject:
    """Deployment, Service and PDB of the stable track; returns the Deployment. A child
    whose owned fields were edited by hand is restored, with a Warning Event saying so.

    While a rollout pins stable (``pin``), its Deployment is only scaled: the spec now
    defines the canary's revision, and the stable template must stay as it is.
    """
    restored: list[str] = []
    if pin:
        deployment = await scale_stable(op, pool, warm)
    else:
        deployment, action = await kube.apply_deployment(
            op.kube, m.build_deployment(pool, revision, warm, "stable")
        )
        restored += ["Deployment"] if action == "restored" else []
    await _testing_pause(op)
    _, action = await kube.apply_service(op.kube, m.build_service(pool, "stable"))
    restored += ["Service"] if action == "restored" else []
    await _testing_pause(op)
    _, action = await kube.apply_pdb(op.kube, m.build_pdb(pool, warm))
    restored += ["PodDisruptionBudget"] if action == "restored" else []
    if restored:
        message = f"restored fields kvpool owns, edited outside kvpool: {', '.join(restored)}"
        await kube.create_event(op.kube, body, "Warning", EVENT_DRIFT, message, utc_now())
    return deployment


async def _testing_pause(op: Operator) -> None:
    if op.config.apply_delay > 0:
        await asyncio.sleep(op.config.apply_delay)


async def write_status(
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
        wire = status.to_wire()
        if status.rollout is not None:
            # explicit nulls: a merge-patch removes a rollout field only when sent as null
            # (never inside list items: canaryPlan.tiers, gates; lists are replaced whole)
            wire["rollout"] = status.rollout.to_merge_patch()
        await kube.apply_status(op.kube, kube.MODELPOOLS, key[0], key[1], wire)
        for event in plan_events(prior, status, assessment):
            await kube.create_event(
                op.kube, body, event.type, event.reason, event.message, utc_now()
            )
    op.statuses[key] = status  # only once written: a failed write is retried next time
    op.metrics.record_conditions(*key, ((k.type, k.status) for k in status.conditions))


async def cleanup_pool(op: Operator, namespace: str, name: str) -> None:
    """Remove a deleted pool's children (ownerReferences do this in a real cluster)."""
    deleted = await kube.delete_children(op.kube, namespace, name)
    op.statuses.pop((namespace, name), None)
    op.metrics.forget_pool(namespace, name)
    if deleted:
        log.info("pool %s/%s deleted: removed %d children", namespace, name, deleted)
