"""Reconciling one ModelPool: observe -> plan -> apply children -> status (+ Events).

Why it exists: this is the orchestration of one pool, kept short on purpose. Each step
observes (Kubernetes, Prometheus; :mod:`.observe`), hands the observations to a pure
decision in ``kvpool.domain``, applies the result through ``kvpool.adapters`` and records
the outcome in ``status`` and Events:

    observe pool + policy + metrics -> check (kvpool validate's checks, domain/validity)
    -> assess capacity -> plan -> decide warm replicas
    -> rollout (controller/rollout.py: canary children, status.rollout)
    -> apply Deployment, Service, PDB -> status (+ Events)
    -> PoolOutcome: the composition root (controller/wiring.py) then requests a config
       publish of the namespace, and a recheck when the rollout wants one soon

Fail-static: when Prometheus is unreachable or returns nothing, the last measurement is
kept (so the plan is kept) and warm replicas never drop below the last count because
metrics vanished. An invalid spec, or a TierPolicy missing or invalid, touches no child
object: the status says why (``Ready=False`` with every field path and reason), a Warning
Event is posted, and the last good plan stays published (``ConfigStale=True``).

Restart safety: child names are deterministic and creation falls back to patching on 409,
so an operator killed mid-reconcile and restarted converges without duplicates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpool.adapters import kube
from kvpool.api.modelpool import ModelPool, ModelPoolStatus
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller import apply
from kvpool.controller.cache import check_object
from kvpool.controller.clock import rfc3339, utc
from kvpool.controller.observe import (
    checked_objects,
    observe_metrics,
    observe_policy,
    prior_status,
)
from kvpool.controller.rollout import (
    StableTrack,
    reconcile_rollout,
    scale_stable,
    stable_revision_of,
)
from kvpool.controller.state import OperatorState, PoolKey
from kvpool.domain import manifests as m
from kvpool.domain.compile import parse_static_endpoints
from kvpool.domain.measurement import assess_capacity, decide_pool_warm_replicas
from kvpool.domain.planner import PoolPlan, plan_pool
from kvpool.domain.pool_status import (
    PoolObservation,
    build_blocked_status,
    build_pool_status,
    keep_load_time,
)
from kvpool.domain.revision import revision_of
from kvpool.domain.rollout.status import build_rollout_status
from kvpool.domain.rollout.timing import to_rfc3339
from kvpool.domain.status_events import plan_events
from kvpool.domain.validity import Checked, Verdict, assess_pool, served_names

log = logging.getLogger(__name__)

RETRY_HOLD_SECONDS = 0.5  # the finalizer write lost a race: reconcile again this soon
EVENT_DRIFT = "DriftRestored"  # a child's owned fields were edited by hand and put back

Body = Mapping[str, Any]


@dataclass(frozen=True)
class PoolOutcome:
    """What follows a pool reconcile (the composition root, :mod:`.wiring`, acts on it)."""

    exists: bool  # False: the pool is gone (its children removed); else publish its namespace
    recheck_after: float | None = None  # reconcile again this soon (a rollout waits)


async def reconcile_pool(state: OperatorState, namespace: str, name: str) -> PoolOutcome:
    """observe -> check -> plan -> apply -> status for one pool (see the module docstring)."""
    started = state.clock.monotonic()
    metrics = state.metrics
    try:
        found = await state.kube.get(kube.MODELPOOLS, namespace, name)
        if found is None or (found.get("metadata") or {}).get("deletionTimestamp"):
            await cleanup_pool(state, namespace, name)
            return PoolOutcome(exists=False)
        body = await _held_for_cleanup(state, found)
        if body is None:
            return PoolOutcome(exists=True, recheck_after=RETRY_HOLD_SECONDS)
        prior = prior_status(state.statuses, (namespace, name), body)
        verdict, pool, policy = await _assess(state, namespace, body)
        recheck = None
        if pool is not None and policy is not None:
            recheck = await _plan_and_apply(state, body, pool, policy, prior)
        else:
            generation = (body.get("metadata") or {}).get("generation")
            status = build_blocked_status(
                prior, generation, verdict.reason, verdict.message, rfc3339(state.clock)
            )
            metrics.plans.labels(verdict.reason).inc()
            await write_status(state, body, prior, status)
        metrics.reconciles.labels("ok").inc()
    except Exception:
        metrics.reconciles.labels("error").inc()
        metrics.errors.labels("reconcile").inc()
        raise
    finally:
        metrics.reconcile_seconds.observe(state.clock.monotonic() - started)
    return PoolOutcome(exists=True, recheck_after=recheck)


async def _held_for_cleanup(state: OperatorState, body: Body) -> Body | None:
    """The pool holding the operator's finalizer, added before any child is written, or
    None when another write won the race (reconcile again shortly).

    kopf adds the same finalizer, but only after the event handlers of that event have run,
    and they have already asked for this reconcile: without this step a pool deleted in
    that window while no operator runs (a rollout of the operator itself) would go at once
    and leave its Deployment, Service and PDB behind."""
    meta = body.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if m.FINALIZER_OPERATOR in finalizers:
        return body
    wanted = [*finalizers, m.FINALIZER_OPERATOR]
    if not await kube.set_finalizers(state.kube, kube.MODELPOOLS, body, wanted):
        return None
    fresh = await state.kube.get(kube.MODELPOOLS, meta.get("namespace") or "default", meta["name"])
    if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
        return None  # deleted meanwhile: the recheck cleans up
    return fresh


async def _assess(
    state: OperatorState, namespace: str, body: Body
) -> tuple[Verdict, ModelPool | None, TierPolicy | None]:
    """The checks of ``kvpool validate`` for this pool as read just now: its own, then
    against its TierPolicy and the served names of the namespace's other pools. The
    pool and policy are returned only when the verdict allows acting on them."""
    cache = state.cache
    checked: Checked[ModelPool] = check_object(body)
    policy = None
    if checked.model is not None:
        ref = checked.model.spec.tier_policy_ref.name
        policy = await observe_policy(cache, state.kube, namespace, ref)
    others = [p for p in checked_objects(cache, cache.pools, namespace) if p.name != checked.name]
    verdict = assess_pool(checked, policy, served_names([*others, checked]))
    if not verdict.valid or checked.model is None or policy is None or policy.model is None:
        return verdict, None, None
    return verdict, checked.model, policy.model


async def _plan_and_apply(
    state: OperatorState,
    body: Body,
    pool: ModelPool,
    policy: TierPolicy,
    prior: ModelPoolStatus | None,
) -> float | None:
    """Plan, apply the children and write the status; returns the rollout's recheck."""
    key = (pool.metadata.namespace or "default", pool.metadata.name)
    moment = utc(state.clock)
    now, spec_revision = to_rfc3339(moment), revision_of(pool.spec)
    # capacity is planned on the revision stable runs (a canary is planned on its own)
    revision = stable_revision_of(prior, spec_revision)
    observed = await observe_metrics(state.snapshots, state.metrics, state.clock, key, revision)
    declared = pool.spec.capacity.kv_tokens_per_replica
    previous = prior.capacity if prior is not None else None
    assessment = assess_capacity(
        observed.readings, observed.state, previous, revision, declared, now
    )
    plan = plan_pool(pool, policy, assessment.kv_tokens)
    warm = decide_pool_warm_replicas(pool, plan, prior, observed.state)
    state.metrics.plans.labels("Planned" if isinstance(plan, PoolPlan) else plan.reason).inc()
    state.metrics.warm_replicas.labels(*key).set(warm)

    stable = StableTrack(spec_revision, assessment.kv_tokens, warm)
    rollout = await reconcile_rollout(state, pool, policy, prior, stable, moment)
    deployment = await _apply_children(state, body, pool, stable, rollout.actions.pin_stable)
    static = state.static.of(pool)
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
        metrics=observed.state,
        metrics_message=observed.message,
        load=keep_load_time(observed.load, prior),
        now=now,
        tokenizer_path=pool.spec.model.tokenizer_path,
    )
    status = build_pool_status(prior, observation, declared)
    status = build_rollout_status(
        status, rollout.status, rollout.canary_ready, pool.metadata.generation, now
    )
    await write_status(state, body, prior, status, assessment)
    for event in rollout.decision.events:
        await kube.create_event(state.kube, body, event.type, event.reason, event.message, now)
    return rollout.recheck_after


async def _apply_children(
    state: OperatorState, body: Body, pool: ModelPool, stable: StableTrack, pin: bool
) -> kube.JsonObject:
    """Deployment, Service and PDB of the stable track; returns the Deployment. A child
    whose owned fields were edited by hand is restored, with a Warning Event saying so.

    While a rollout pins stable (``pin``), its Deployment is only scaled: the spec now
    defines the canary's revision, and the stable template must stay as it is.
    """
    client, warm = state.kube, stable.warm_replicas
    restored: list[str] = []
    if pin:
        deployment = await scale_stable(client, pool, warm)
    else:
        desired = m.build_deployment(pool, stable.spec_revision, warm, "stable")
        deployment, action = await apply.apply_deployment(client, desired)
        restored += ["Deployment"] if action == "restored" else []
    await _testing_pause(state)
    _, action = await apply.apply_service(client, m.build_service(pool, "stable"))
    restored += ["Service"] if action == "restored" else []
    await _testing_pause(state)
    _, action = await apply.apply_pdb(client, m.build_pdb(pool, warm))
    restored += ["PodDisruptionBudget"] if action == "restored" else []
    if restored:
        message = f"restored fields kvpool owns, edited outside kvpool: {', '.join(restored)}"
        now = rfc3339(state.clock)
        await kube.create_event(client, body, "Warning", EVENT_DRIFT, message, now)
    return deployment


async def _testing_pause(state: OperatorState) -> None:
    if state.config.apply_delay > 0:
        await state.clock.sleep(state.config.apply_delay)


async def write_status(
    state: OperatorState,
    body: Body,
    prior: ModelPoolStatus | None,
    status: ModelPoolStatus,
    assessment: Any = None,
) -> None:
    """Patch ``status`` when it changed, remember it, and emit the Events it implies."""
    meta = body["metadata"]
    key: PoolKey = (meta.get("namespace") or "default", meta["name"])
    if prior is None or prior.to_wire() != status.to_wire():
        wire = status.to_wire()
        if status.rollout is not None:
            # explicit nulls: a merge-patch removes a rollout field only when sent as null
            # (never inside list items: canaryPlan.tiers, gates; lists are replaced whole)
            wire["rollout"] = status.rollout.to_merge_patch()
        await kube.apply_status(state.kube, kube.MODELPOOLS, *key, wire)
        for event in plan_events(prior, status, assessment):
            now = rfc3339(state.clock)
            await kube.create_event(state.kube, body, event.type, event.reason, event.message, now)
    state.statuses[key] = status  # only once written: a failed write is retried next time
    state.metrics.record_conditions(*key, ((k.type, k.status) for k in status.conditions))


async def cleanup_pool(state: OperatorState, namespace: str, name: str) -> None:
    """Remove a deleted pool's children (ownerReferences do this in a real cluster)."""
    deleted = await kube.delete_children(state.kube, namespace, name)
    state.statuses.pop((namespace, name), None)
    state.metrics.forget_pool(namespace, name)
    if deleted:
        log.info("pool %s/%s deleted: removed %d children", namespace, name, deleted)
