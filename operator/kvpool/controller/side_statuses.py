"""The statuses of TierPolicies and TenantBudgets: pools using a policy, a tenant's key.

Why it exists: these statuses follow every config publish of a namespace but must never
delay it (a namespace may hold thousands of tenants), so they run on their own coalescing
queue in the background. The decisions are pure (:mod:`kvpool.domain.side_statuses`); this
module reads the cache and patches a status only when it differs from what is stored or
was last written, posts a Warning Event when an object becomes invalid, and keeps the
``kvpool.dev/in-use`` finalizer on every TierPolicy a ModelPool references.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic

from kvpool.adapters import kube
from kvpool.api.common import Condition
from kvpool.api.tenantbudget import TenantBudgetStatus
from kvpool.api.tierpolicy import TierPolicyStatus
from kvpool.controller.cache import Cache, key_refs_of
from kvpool.controller.clock import rfc3339
from kvpool.controller.observe import assess_cached_namespace
from kvpool.controller.state import OperatorState
from kvpool.domain.side_statuses import (
    FINALIZER_IN_USE,
    KeyLookup,
    build_budget_status,
    build_policy_status,
)
from kvpool.domain.status_events import status_events
from kvpool.domain.validity import NamespaceVerdicts

Body = Mapping[str, Any]


async def apply_side_statuses(state: OperatorState, namespace: str) -> None:
    """TierPolicy and TenantBudget statuses of a namespace (validity, pools using a policy,
    key resolved) and the in-use finalizer of each TierPolicy."""
    verdicts = assess_cached_namespace(state.cache, namespace)
    for body, users in _policy_users(state.cache, namespace):
        await _apply_in_use_finalizer(state.kube, body, users)
        status = _policy_status(body, users, verdicts, rfc3339(state.clock))
        await _apply_aux_status(state, kube.TIERPOLICIES, body, status)
    for body in list(state.cache.budgets.get(namespace, {}).values()):
        status = _budget_status(state.cache, namespace, body, verdicts, rfc3339(state.clock))
        await _apply_aux_status(state, kube.TENANTBUDGETS, body, status)


async def _apply_aux_status(
    state: OperatorState, resource: kube.Resource, body: Body, status: dict[str, Any]
) -> None:
    """Patch a TierPolicy/TenantBudget status unless it already says this; post a Warning
    Event when it enters (or changes within) a blocking reason such as InvalidSpec."""
    meta = body["metadata"]
    key = (resource.plural, meta.get("namespace") or "default", meta["name"])
    if state.written.get(key) == status or body.get("status") == status:
        return
    await kube.apply_status(state.kube, resource, key[1], key[2], status)
    before = state.written.get(key) or body.get("status") or {}
    state.written[key] = status
    for event in status_events(_conditions(before), _conditions(status)):
        now = rfc3339(state.clock)
        await kube.create_event(state.kube, body, event.type, event.reason, event.message, now)


def _conditions(status: Mapping[str, Any]) -> list[Condition]:
    try:
        return [Condition.model_validate(x) for x in status.get("conditions") or []]
    except pydantic.ValidationError:
        return []


def _policy_users(cache: Cache, namespace: str) -> list[tuple[Body, list[str]]]:
    """Each TierPolicy of the namespace with the ModelPools (not being deleted) using it."""
    pools = [
        p
        for p in list(cache.pools.get(namespace, {}).values())
        if not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    return [
        (
            body,
            [
                p["metadata"]["name"]
                for p in pools
                if ((p.get("spec") or {}).get("tierPolicyRef") or {}).get("name")
                == body["metadata"]["name"]
            ],
        )
        for body in list(cache.policies.get(namespace, {}).values())
    ]


def _policy_status(
    body: Body, users: list[str], verdicts: NamespaceVerdicts, now: str
) -> dict[str, Any]:
    meta = body["metadata"]
    deleting = bool(meta.get("deletionTimestamp"))
    status = build_policy_status(
        _parse_or_none(TierPolicyStatus, body.get("status")),
        meta.get("generation"),
        len(users),
        now,
        verdicts.policies.get(meta["name"]),
        users if deleting else (),
    )
    return status.to_wire()


async def _apply_in_use_finalizer(client: kube.KubeClient, body: Body, users: list[str]) -> None:
    """Hold ``kvpool.dev/in-use`` on a TierPolicy while ModelPools use it (as Kueue does
    for its queues): deleting it then waits until no pool does. Released when unused.

    Decided on the cached object, then again on a fresh read, and written guarded by
    that read's resourceVersion (a 409 is retried by the next trigger or timer tick)."""
    if _finalizers_wanted(body, users) is None:
        return
    meta = body["metadata"]
    fresh = await client.get(kube.TIERPOLICIES, meta.get("namespace") or "default", meta["name"])
    wanted = _finalizers_wanted(fresh, users) if fresh is not None else None
    if fresh is not None and wanted is not None:
        await kube.set_finalizers(client, kube.TIERPOLICIES, fresh, wanted)


def _finalizers_wanted(body: Body, users: list[str]) -> list[str] | None:
    """The finalizers a TierPolicy should have, or None when they are right already."""
    meta = body.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    held = FINALIZER_IN_USE in finalizers
    if users and not held and not meta.get("deletionTimestamp"):
        return [*finalizers, FINALIZER_IN_USE]
    if not users and held:
        return [f for f in finalizers if f != FINALIZER_IN_USE]
    return None


def _budget_status(
    cache: Cache, namespace: str, body: Body, verdicts: NamespaceVerdicts, now: str
) -> dict[str, Any]:
    keys = [
        KeyLookup(secret, key, key in cache.secrets.get((namespace, secret), {}))
        for secret, key in key_refs_of(body)
    ]
    status = build_budget_status(
        _parse_or_none(TenantBudgetStatus, body.get("status")),
        body["metadata"].get("generation"),
        keys,
        now,
        verdicts.budgets.get(body["metadata"]["name"]),
    )
    return status.to_wire()


def _parse_or_none(model: Any, raw: Any) -> Any:
    try:
        return model.model_validate(raw) if raw else None
    except pydantic.ValidationError:
        return None
