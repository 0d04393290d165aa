"""The leader-election Lease (coordination.k8s.io/v1): read it, write it, release it.

Why it exists: the election's decision is pure (:mod:`kvpool.domain.leadership`) and
works on a :class:`~kvpool.domain.leadership.LeaseRecord`; this module turns the stored
Lease into one and writes the holder's spec back, guarded by the resourceVersion read so
that of two replicas writing at once exactly one wins (the other gets a 409).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from kvpool.adapters.kube.client import KubeClient
from kvpool.adapters.kube.errors import ConflictError
from kvpool.adapters.kube.resources import LEASES
from kvpool.domain.leadership import LeaseRecord


def _micro_time(epoch: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def lease_record(body: Mapping[str, Any] | None) -> LeaseRecord | None:
    """The decision-relevant part of a coordination.k8s.io/v1 Lease (None: no Lease)."""
    if body is None:
        return None
    spec = body.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or None,
        duration=float(spec.get("leaseDurationSeconds") or 0),
        renewed_at=_epoch(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


async def write_lease(
    client: KubeClient,
    namespace: str,
    name: str,
    current: Mapping[str, Any] | None,
    spec: Mapping[str, Any],
) -> bool:
    """Create the Lease, or merge-patch ``spec`` guarded by the resourceVersion read.

    False when another replica wrote first (409): it won this round.
    """
    try:
        if current is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": dict(spec),
            }
            await client.create(LEASES, namespace, body)
        else:
            version = (current.get("metadata") or {}).get("resourceVersion")
            patch = {"metadata": {"resourceVersion": version}, "spec": dict(spec)}
            if await client.merge_patch(LEASES, namespace, name, patch) is None:
                return False  # deleted meanwhile: decide again next round
    except ConflictError:
        return False
    return True


def build_lease_spec(
    holder: str, duration: float, now: float, transitions: int, acquired_at: float | None
) -> dict[str, Any]:
    """The Lease ``spec`` a holder writes (``holder`` "" releases it)."""
    spec: dict[str, Any] = {
        "holderIdentity": holder,
        "leaseDurationSeconds": max(1, round(duration)),
        "renewTime": _micro_time(now),
        "leaseTransitions": transitions,
    }
    if acquired_at is not None:
        spec["acquireTime"] = _micro_time(acquired_at)
    return spec
