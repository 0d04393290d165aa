"""Label-selected watches of the Secrets and Pods the operator needs, and nothing else.

Why it exists: kopf filters labels on the client side, so a kopf handler for Secrets
would list and watch every Secret the RBAC allows (and hold them in memory). The
operator needs only tenant API keys - Secrets labelled ``kvpool.dev/api-key`` - and
engine Pods - labelled ``kvpool.dev/pool`` - so it watches those with the selector sent
to the API server (:class:`kvpool.adapters.kube.LabelWatch`). Secrets are reduced to
digests on arrival; a change of a Secret a TenantBudget references, or of an engine
Pod's IP or readiness, requests a config publish of its namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvpool.adapters import kube
from kvpool.api.tenantbudget import API_KEY_SECRET_LABEL
from kvpool.domain.manifests import LABEL_POOL

if TYPE_CHECKING:
    from kvpool.controller.context import Operator

Body = Mapping[str, Any]


def _key(body: Body) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "default", meta["name"]


def build_watches(op: Operator, namespace: str | None) -> list[kube.LabelWatch]:
    """The Secret and Pod watches of one scope (a namespace, or None for all)."""

    async def on_secret(kind: str, body: kube.JsonObject) -> None:
        key = _key(body)
        before = op.cache.secrets.get(key)
        op.cache.put_secret(key, None if kind == "DELETED" else body)
        if op.cache.secrets.get(key) != before and op.cache.referenced_secret(*key):
            op.spawn(op.publisher.request(key[0]))

    async def on_secrets(items: list[kube.JsonObject]) -> None:
        op.cache.replace_secrets(namespace, items)

    async def on_pod(kind: str, body: kube.JsonObject) -> None:
        ns, name = _key(body)
        pool = ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL, "")
        before = op.cache.pods.get((ns, pool), {}).get(name)
        op.cache.put_pod((ns, name), None if kind == "DELETED" else body)
        if op.cache.pods.get((ns, pool), {}).get(name) != before:
            op.spawn(op.publisher.request(ns))

    async def on_pods(items: list[kube.JsonObject]) -> None:
        op.cache.replace_pods(namespace, items)

    return [
        kube.LabelWatch(
            op.kube, kube.SECRETS, namespace, API_KEY_SECRET_LABEL, on_secret, on_secrets
        ),
        kube.LabelWatch(op.kube, kube.PODS, namespace, LABEL_POOL, on_pod, on_pods),
    ]


async def start_watches(op: Operator, namespaces: tuple[str, ...]) -> None:
    """Prime every watch (their objects are in the cache when this returns), then follow
    them in the background."""
    for namespace in namespaces or (None,):
        for watch in build_watches(op, namespace):
            await watch.prime()
            op.spawn(watch.follow())
