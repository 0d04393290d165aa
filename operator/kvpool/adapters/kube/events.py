"""Kubernetes Events about an object: what the operator decided, for ``kubectl describe``.

Why it exists: Events are best effort - an operator whose Event is refused must still
finish its reconcile - so posting one logs a failure instead of raising it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kvpool.adapters.kube.client import KubeClient
from kvpool.adapters.kube.errors import ApiError
from kvpool.adapters.kube.resources import EVENTS

log = logging.getLogger(__name__)

COMPONENT = "kvpool-operator"
MAX_MESSAGE = 1024  # characters of a message kept (the API server refuses longer ones)


async def create_event(
    client: KubeClient,
    involved: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    now: str,
    component: str = COMPONENT,
) -> None:
    """Post a core/v1 Event about an object (best effort: a failed Event is only logged)."""
    meta = involved.get("metadata") or {}
    ns = meta.get("namespace") or "default"
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'kvpool')}.", "namespace": ns},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta.get("name"),
            "namespace": ns,
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await client.create(EVENTS, ns, body)
    except ApiError as exc:
        log.warning("event %s on %s/%s not posted: %s", reason, ns, meta.get("name"), exc)
