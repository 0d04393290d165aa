"""How the operator brings an owned child to what it wants: the spec-hash and drift policy.

Why it exists: deciding *whether* to write a child is the controller's policy, not API
I/O. Each ``apply_*`` owns one kind of child and writes only when the child's
``kvpool.dev/spec-hash`` annotation (or the Deployment's replica count) differs from the
desired object, or when a field kvpool owns was edited by hand (drift, compared tolerating
server defaults: :mod:`kvpool.domain.drift`), so an unchanged plan makes no writes and
triggers no watch events. A 409 on create means the object exists (a restarted operator
finds what it created: names are deterministic) and turns into a read-then-patch. The
calls themselves are :mod:`kvpool.adapters.kube`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kvpool.adapters import kube
from kvpool.api.admission_config import CONFIGMAP_KEY, SHARDS_KEY, AdmissionConfig
from kvpool.domain.compile import config_hash
from kvpool.domain.drift import find_drift
from kvpool.domain.manifests import ANNOTATION_CONFIG_HASH, ANNOTATION_SPEC_HASH

log = logging.getLogger(__name__)


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def _replace_ops(
    current: kube.JsonObject, desired: kube.JsonObject, owned: tuple[str, ...]
) -> list[kube.JsonObject]:
    """JSON-patch ops setting our labels/annotations (others' kept) and replacing owned parts.

    Replacing (not merging) the owned top-level fields is what removes a field the spec no
    longer sets, e.g. a dropped nodeSelector.
    """
    meta, want = current.get("metadata") or {}, desired["metadata"]
    ops: list[kube.JsonObject] = []
    for key in ("labels", "annotations"):
        merged = {**(meta.get(key) or {}), **(want.get(key) or {})}
        ops.append({"op": "add", "path": f"/metadata/{key}", "value": merged})
    if "ownerReferences" in want:
        ops.append(
            {"op": "add", "path": "/metadata/ownerReferences", "value": want["ownerReferences"]}
        )
    ops += [{"op": "add", "path": f"/{field}", "value": desired[field]} for field in owned]
    return ops


async def apply_owned(
    client: kube.KubeClient,
    resource: kube.Resource,
    desired: kube.JsonObject,
    *,
    owned: tuple[str, ...] = ("spec",),
    hash_annotation: str = ANNOTATION_SPEC_HASH,
    drift: Callable[[kube.JsonObject, kube.JsonObject], list[str]] | None = None,
) -> tuple[kube.JsonObject, str]:
    """Create ``desired`` or bring the existing object to it; returns (object, action).

    ``action`` is ``created``, ``updated`` (the spec-hash changed), ``restored`` (the hash
    is ours but a field we own was edited by hand: :func:`kvpool.domain.drift.find_drift`),
    ``scaled`` or ``unchanged``.
    """
    ns, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    current = await client.get(resource, ns, name)
    if current is None:
        try:
            return await client.create(resource, ns, desired), "created"
        except kube.ConflictError:
            current = await client.get(resource, ns, name)  # created by a previous run
            if current is None:
                raise
    if _annotation(current, hash_annotation) != _annotation(desired, hash_annotation):
        patched = await client.json_patch(resource, ns, name, _replace_ops(current, desired, owned))
        return patched or current, "updated"
    drifted = (drift or (lambda c, d: owned_drift(c, d, owned)))(current, desired)
    if drifted:
        log.warning(
            "%s %s/%s: restoring fields edited outside kvpool: %s",
            resource.plural,
            ns,
            name,
            ", ".join(drifted),
        )
        patched = await client.json_patch(resource, ns, name, _replace_ops(current, desired, owned))
        return patched or current, "restored"
    want_replicas = (desired.get("spec") or {}).get("replicas")
    if want_replicas is not None and (current.get("spec") or {}).get("replicas") != want_replicas:
        patched = await client.merge_patch(
            resource, ns, name, {"spec": {"replicas": want_replicas}}
        )
        return patched or current, "scaled"
    return current, "unchanged"


def owned_drift(
    current: kube.JsonObject, desired: kube.JsonObject, owned: tuple[str, ...]
) -> list[str]:
    """Fields kvpool owns (the ``owned`` parts and its labels) that no longer match;
    ``spec.replicas`` is compared on its own (scaling is not drift)."""
    want: kube.JsonObject = {field: desired.get(field) for field in owned}
    spec = want.get("spec")
    if isinstance(spec, dict):
        want["spec"] = {k: v for k, v in spec.items() if k != "replicas"}
    want["metadata"] = {"labels": (desired.get("metadata") or {}).get("labels") or {}}
    return find_drift(want, current)


async def apply_deployment(
    client: kube.KubeClient, desired: kube.JsonObject
) -> tuple[kube.JsonObject, str]:
    """The engine Deployment of one track (template by hash, replicas compared on their own)."""
    return await apply_owned(client, kube.DEPLOYMENTS, desired)


async def apply_service(
    client: kube.KubeClient, desired: kube.JsonObject
) -> tuple[kube.JsonObject, str]:
    """The Service of one track."""
    return await apply_owned(client, kube.SERVICES, desired)


async def apply_pdb(
    client: kube.KubeClient, desired: kube.JsonObject
) -> tuple[kube.JsonObject, str]:
    """The PodDisruptionBudget of a pool."""
    return await apply_owned(client, kube.PDBS, desired)


async def apply_admission_configmap(client: kube.KubeClient, desired: kube.JsonObject) -> str:
    """The namespace's compiled admission ConfigMap (rewritten when its config hash differs,
    or when its content no longer hashes to it: a hand-edited config is put back)."""
    _, action = await apply_owned(
        client,
        kube.CONFIGMAPS,
        desired,
        owned=("data",),
        hash_annotation=ANNOTATION_CONFIG_HASH,
        drift=_config_drift,
    )
    return action


async def apply_tenant_shard(client: kube.KubeClient, desired: kube.JsonObject) -> str:
    """One tenant shard of a sharded config (content-addressed: created once, put back
    when edited by hand)."""
    _, action = await apply_owned(
        client, kube.CONFIGMAPS, desired, owned=("data",), hash_annotation=ANNOTATION_CONFIG_HASH
    )
    return action


def _config_drift(current: kube.JsonObject, desired: kube.JsonObject) -> list[str]:
    """The stored config no longer hashes to kvpool's config-hash (``generatedAt`` aside);
    for the index of a sharded config: its pools and policies, or the shards it names,
    differ from what kvpool wrote."""
    data, want = current.get("data") or {}, desired.get("data") or {}
    text = data.get(CONFIGMAP_KEY)
    wanted: str | None
    try:
        stored = config_hash(AdmissionConfig.model_validate_json(text or ""))
        if SHARDS_KEY in want:
            wanted = config_hash(AdmissionConfig.model_validate_json(want[CONFIGMAP_KEY]))
        else:
            wanted = _annotation(desired, ANNOTATION_CONFIG_HASH)
    except ValueError:
        return [f"data.{CONFIGMAP_KEY}"]
    drifted = [] if stored == wanted else [f"data.{CONFIGMAP_KEY}"]
    if data.get(SHARDS_KEY) != want.get(SHARDS_KEY):
        drifted.append(f"data.{SHARDS_KEY}")
    return drifted
