"""The operator's writes to objects it does not own: status, finalizers, child cleanup.

Why it exists: the operator never writes a custom resource's spec; it merge-patches its
``status`` subresource, replaces finalizers guarded by the resourceVersion it read, and
(the cleanup path: the test API server collects no garbage by label) deletes a deleted
pool's children found by label. The owned children themselves are applied by the
controller's apply policy (:mod:`kvpool.controller.apply`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpool.adapters.kube.client import JsonObject, KubeClient
from kvpool.adapters.kube.errors import ConflictError
from kvpool.adapters.kube.resources import CHILD_RESOURCES, Resource
from kvpool.domain.manifests import LABEL_MANAGED_BY, LABEL_POOL, MANAGED_BY


async def apply_status(
    client: KubeClient, resource: Resource, namespace: str, name: str, status: JsonObject
) -> JsonObject | None:
    """Merge-patch the ``status`` subresource (never the spec)."""
    return await client.merge_patch(resource, namespace, name, {"status": status}, sub="status")


async def set_finalizers(
    client: KubeClient, resource: Resource, body: Mapping[str, Any], finalizers: list[str]
) -> bool:
    """Replace an object's finalizers, guarded by its resourceVersion; False on a 409
    (the object changed meanwhile: the caller decides again on the next event)."""
    meta = body.get("metadata") or {}
    patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}}
    try:
        await client.merge_patch(resource, meta.get("namespace") or "default", meta["name"], patch)
    except ConflictError:
        return False
    return True


async def delete_children(client: KubeClient, namespace: str, pool: str) -> int:
    """Delete every child of a pool found by label (the cleanup path: no GC in tests)."""
    labels = {LABEL_POOL: pool, LABEL_MANAGED_BY: MANAGED_BY}
    deleted = 0
    for resource in CHILD_RESOURCES:
        for obj in await client.list_objects(resource, namespace, labels):
            if await client.delete(resource, namespace, obj["metadata"]["name"]):
                deleted += 1
    return deleted
