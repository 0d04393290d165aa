"""The operator's in-memory view of its inputs: policies, budgets, key digests, pools, pods.

Why it exists: compiling a namespace's config needs every TierPolicy, TenantBudget, Secret
digest, ModelPool and engine Pod of it, and reading them from the API server on every
change would cost O(objects) requests per change. So the cache is filled by one list per
kind at start-up (before any handler acts: a first config is never missing tenants that
simply were not seen yet) and kept current by the watch events kopf delivers.

(kopf's own indices would give the same start-up guarantee, but kopf makes every object's
worker wait on one shared "all indexed" toggle, which costs O(objects^2) wake-ups: with
1,000 pools and 10,000 budgets and Secrets the operator did not start acting within
minutes. Lists plus events are linear.)

Secrets: only those labelled ``kvpool.dev/api-key`` are listed and watched (the label
selector is applied by the API server), and they are reduced to SHA-256 digests of their
values as they arrive: no API key is held, no other Secret is read (the watches are in
:mod:`kvpool.controller.watches`). The checks ``kvpool validate`` runs on one object are
memoised per object and resourceVersion (:meth:`Cache.checked`): a publish re-checks only
what changed.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvpool.adapters import kube
from kvpool.api.validation import check_custom_object
from kvpool.domain.api_keys import api_key_digest
from kvpool.domain.compile import PodView
from kvpool.domain.manifests import LABEL_POOL, LABEL_TRACK
from kvpool.domain.validity import Checked

Body = Mapping[str, Any]
Key = tuple[str, str]  # (namespace, name)


def plain(body: Body) -> dict[str, Any]:
    """A detached plain-dict copy of a (kopf) body, without managedFields noise."""
    copied: dict[str, Any] = json.loads(json.dumps(body, default=dict))
    copied.get("metadata", {}).pop("managedFields", None)
    return copied


def secret_digests(body: Body) -> dict[str, str]:
    """SHA-256 digests of a Secret's values (``data`` is base64, ``stringData`` plain)."""
    digests: dict[str, str] = {}
    for key, value in (body.get("data") or {}).items():
        try:
            digests[key] = api_key_digest(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue
    for key, value in (body.get("stringData") or {}).items():
        digests[key] = api_key_digest(str(value))
    return digests


def key_refs_of(budget: Body) -> list[tuple[str, str]]:
    """(Secret, key) of every API key a TenantBudget body references, as stored (it may be
    invalid): ``apiKeySecretRef`` first, then ``apiKeySecretRefs``."""
    spec = budget.get("spec") or {}
    refs = [spec.get("apiKeySecretRef"), *(spec.get("apiKeySecretRefs") or [])]
    return [
        (str(ref.get("name", "")), str(ref.get("key", ""))) for ref in refs if isinstance(ref, dict)
    ]


def pod_view(body: Body) -> PodView:
    """What the config needs of an engine Pod: name, IP, readiness, track."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return PodView(
        name=meta["name"],
        ip=status.get("podIP"),
        ready=ready and not meta.get("deletionTimestamp"),
        track=(meta.get("labels") or {}).get(LABEL_TRACK, "stable"),
    )


def check_object(body: Body) -> Checked[Any]:
    """Run the single-object checks of ``kvpool validate`` on an object as stored."""
    meta = body.get("metadata") or {}
    stored = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    model, findings = check_custom_object(stored)
    return Checked(
        name=str(meta.get("name", "")),
        created=str(meta.get("creationTimestamp") or ""),
        model=model if not findings else None,
        findings=tuple(findings),
    )


def _ns_name(body: Body) -> Key:
    meta = body.get("metadata") or {}
    return meta.get("namespace") or "default", meta["name"]


@dataclass
class Cache:
    """Objects by namespace; each ``put_*`` takes a body, or None when it was deleted."""

    policies: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    budgets: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    secrets: dict[Key, dict[str, str]] = field(default_factory=dict)  # digests only
    pools: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    pods: dict[Key, dict[str, PodView]] = field(default_factory=dict)  # (ns, pool) -> pods
    _models: dict[tuple[str, str, str], tuple[str, Any]] = field(default_factory=dict)

    @staticmethod
    def _put(table: dict[str, dict[str, Any]], key: Key, value: Any) -> None:
        ns, name = key
        if value is None:
            table.get(ns, {}).pop(name, None)
        else:
            table.setdefault(ns, {})[name] = value

    def put_policy(self, key: Key, body: Body | None) -> None:
        self._put(self.policies, key, plain(body) if body is not None else None)

    def put_budget(self, key: Key, body: Body | None) -> None:
        self._put(self.budgets, key, plain(body) if body is not None else None)

    def put_pool(self, key: Key, body: Body | None) -> None:
        self._put(self.pools, key, plain(body) if body is not None else None)

    def put_secret(self, key: Key, body: Body | None) -> None:
        if body is None:
            self.secrets.pop(key, None)
        else:
            self.secrets[key] = secret_digests(body)

    def replace_secrets(self, namespace: str | None, bodies: Sequence[Body]) -> None:
        """The complete set of labelled Secrets of a namespace (None: all), after a list."""
        for key in [k for k in self.secrets if namespace in (None, k[0])]:
            del self.secrets[key]
        for body in bodies:
            self.put_secret(_ns_name(body), body)

    def replace_pods(self, namespace: str | None, bodies: Sequence[Body]) -> None:
        """The complete set of engine Pods of a namespace (None: all), after a list."""
        for key in [k for k in self.pods if namespace in (None, k[0])]:
            del self.pods[key]
        for body in bodies:
            self.put_pod(_ns_name(body), body)

    def put_pod(self, key: Key, body: Body | None) -> None:
        ns, name = key
        for (pod_ns, _), pods in self.pods.items():
            if pod_ns == ns:
                pods.pop(name, None)  # its pool label may have changed
        labels = ((body or {}).get("metadata") or {}).get("labels") or {}
        if body is not None and LABEL_POOL in labels:
            self.pods.setdefault((ns, labels[LABEL_POOL]), {})[name] = pod_view(body)

    def checked(self, body: Body) -> Checked[Any]:
        """The checks of ``kvpool validate`` that need only this object (schema, CEL
        rules, the model, semantic checks), memoised per object and resourceVersion."""
        meta = body.get("metadata") or {}
        kind = str(body.get("kind"))
        key = (f"checked:{kind}", meta.get("namespace") or "default", meta.get("name", ""))
        version = str(meta.get("resourceVersion"))
        hit = self._models.get(key)
        if hit is not None and hit[0] == version:
            memo: Checked[Any] = hit[1]
            return memo
        value = check_object(body)
        self._models[key] = (version, value)
        return value

    def policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.policies.get(namespace, {}).get(name)

    def referenced_secret(self, namespace: str, name: str) -> bool:
        """Whether a TenantBudget of the namespace reads a key from this Secret."""
        return any(
            secret == name
            for b in self.budgets.get(namespace, {}).values()
            for secret, _ in key_refs_of(b)
        )


async def fill_cache(cache: Cache, client: kube.KubeClient, namespaces: tuple[str, ...]) -> None:
    """One list per kvpool kind (cluster-wide, or per watched namespace) into an empty cache.

    Secrets and Pods come from label-selected watches (:mod:`kvpool.controller.watches`),
    primed before any handler acts."""
    scopes: tuple[str | None, ...] = namespaces or (None,)
    for ns in scopes:
        for resource, put in (
            (kube.TIERPOLICIES, cache.put_policy),
            (kube.TENANTBUDGETS, cache.put_budget),
            (kube.MODELPOOLS, cache.put_pool),
        ):
            for body in await client.list_objects(resource, ns):
                put(_ns_name(body), body)
