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

from collections.abc import Callable, Mapping
from typing import Any

from kvpool.adapters import kube
from kvpool.api.tenantbudget import API_KEY_SECRET_LABEL
from kvpool.controller.cache import Cache
from kvpool.domain.manifests import LABEL_POOL

Body = Mapping[str, Any]
RequestPublish = Callable[[str], None]  # ask for a publish of a namespace (in the background)


def _key(body: Body) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "default", meta["name"]


def build_watches(
    cache: Cache, client: kube.KubeClient, publish: RequestPublish, namespace: str | None
) -> list[kube.LabelWatch]:
    """The Secret and Pod watches of one scope (a namespace, or None for all)."""

    async def on_secret(kind: str, body: kube.JsonObject) -> None:
        key = _key(body)
        before = cache.secrets.get(key)
        cache.put_secret(key, None if kind == "DELETED" else body)
        if cache.secrets.get(key) != before and cache.referenced_secret(*key):
            publish(key[0])

    async def on_secrets(items: list[kube.JsonObject]) -> None:
        cache.replace_secrets(namespace, items)

    async def on_pod(kind: str, body: kube.JsonObject) -> None:
        ns, name = _key(body)
        pool = ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL, "")
        before = cache.pods.get((ns, pool), {}).get(name)
        cache.put_pod((ns, name), None if kind == "DELETED" else body)
        if cache.pods.get((ns, pool), {}).get(name) != before:
            publish(ns)

    async def on_pods(items: list[kube.JsonObject]) -> None:
        cache.replace_pods(namespace, items)

    return [
        kube.LabelWatch(
            client, kube.SECRETS, namespace, API_KEY_SECRET_LABEL, on_secret, on_secrets
        ),
        kube.LabelWatch(client, kube.PODS, namespace, LABEL_POOL, on_pod, on_pods),
    ]
