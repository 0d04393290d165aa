"""The kopf handlers of the operator: they only decide *what* to reconcile and when.

Why it exists: kopf tells us that something changed; the work itself (observe, plan,
apply, status) is in :mod:`kvpool.controller.reconcile`. Every trigger funnels into two
coalescing queues - per pool and per namespace - so a burst of changes costs one
reconcile, and two triggers never reconcile one pool concurrently.

Re-plan triggers:

- ModelPool: a change of generation, labels or annotations, or deletion (status writes
  are not changes: the operator's own status patches must not re-trigger it);
- TierPolicy: every pool of the namespace that references it, then the namespace config;
- TenantBudget, and Secrets that a TenantBudget references: the namespace config;
- engine Deployments (label ``kvpool.dev/pool``): their ready/desired counts;
- engine Pods (label ``kvpool.dev/pool``): IP or readiness -> the config's endpoints;
- a timer per pool (``--measure-interval``, default 15 s): a new measurement.

kopf indices keep the policies, budgets, secret-key digests (never the keys), pools and
pods in memory; kopf fills them before any handler runs, so the first reconcile after a
restart already sees every TierPolicy. Peering (one active replica) and liveness are kopf's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from kvpool.adapters import kube
from kvpool.controller.reconcile import Indices, Operator, cleanup_pool
from kvpool.domain.compile import PodView, hash_api_key
from kvpool.domain.manifests import LABEL_MANAGED_BY, LABEL_POOL, LABEL_TRACK, MANAGED_BY

log = logging.getLogger(__name__)

GROUP, VERSION = "kvpool.dev", "v1alpha1"
FINALIZER = "kvpool.dev/operator"


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A detached plain-dict copy of a kopf body."""
    return json.loads(json.dumps(body, default=dict))  # type: ignore[no-any-return]


def _secret_digests(body: Mapping[str, Any]) -> dict[str, str]:
    import base64

    digests = {k: hash_api_key(base64.b64decode(v)) for k, v in (body.get("data") or {}).items()}
    for k, v in (body.get("stringData") or {}).items():
        digests[k] = hash_api_key(str(v).encode())
    return digests


def _pod_view(body: Mapping[str, Any]) -> PodView:
    status = body.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    labels = (body.get("metadata") or {}).get("labels") or {}
    return PodView(
        name=body["metadata"]["name"],
        ip=status.get("podIP"),
        ready=ready and not body["metadata"].get("deletionTimestamp"),
        track=labels.get(LABEL_TRACK, "stable"),
    )


class Fingerprints:
    """Remembers what was last seen of each object, to tell a change from our own echo."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, str], Any] = {}

    def changed(self, kind: str, namespace: str, name: str, fingerprint: Any) -> bool:
        key = (kind, namespace, name)
        if self._seen.get(key) == fingerprint:
            return False
        self._seen[key] = fingerprint
        return True

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self._seen.pop((kind, namespace, name), None)


def _essence(meta: Mapping[str, Any]) -> tuple[Any, ...]:
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith("kopf.")
    }
    return (
        meta.get("generation"),
        json.dumps(meta.get("labels") or {}, sort_keys=True),
        json.dumps(annotations, sort_keys=True),
        bool(meta.get("deletionTimestamp")),
    )


def build_registry(op: Operator) -> kopf.OperatorRegistry:
    """All handlers of the operator, bound to one :class:`Operator`."""
    registry = kopf.OperatorRegistry()
    seen = Fingerprints()
    cfg = op.config

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        conn = op.kube.conn
        token = conn.token_file.read_text().strip() if conn.token_file else conn.token
        return kopf.ConnectionInfo(
            server=conn.server,
            ca_path=conn.ca_file,
            insecure=not conn.verify,
            token=token,
            certificate_path=conn.cert_file,
            private_key_path=conn.key_file,
        )

    @kopf.on.startup(id="startup", registry=registry)
    async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix="kopf.kvpool.dev"
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="kopf.kvpool.dev"
        )
        settings.posting.enabled = False  # the operator posts its own, meaningful Events
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 30
        op.indices = Indices(
            policies=kwargs["policy_index"],
            budgets=kwargs["budget_index"],
            secrets=kwargs["secret_index"],
            pools=kwargs["pool_index"],
            pods=kwargs["pod_index"],
        )

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await op.kube.close()

    @kopf.on.probe(id="metrics", registry=registry)
    def probe(**_: Any) -> dict[str, Any]:
        return {"prometheus": cfg.prometheus_url, "lastSnapshot": op.snapshots.last_success}

    # --- indices -----------------------------------------------------------------------------

    @kopf.index(GROUP, VERSION, "tierpolicies", id="policy_index", registry=registry)
    def policy_index(**kw: Any) -> Any:
        namespace = kw["namespace"]
        name = kw["name"]
        body = kw["body"]
        return {(namespace, name): _plain(body)}

    @kopf.index(GROUP, VERSION, "tenantbudgets", id="budget_index", registry=registry)
    def budget_index(**kw: Any) -> Any:
        namespace = kw["namespace"]
        body = kw["body"]
        return {namespace: _plain(body)}

    @kopf.index("v1", "secrets", id="secret_index", registry=registry)
    def secret_index(**kw: Any) -> Any:
        namespace = kw["namespace"]
        name = kw["name"]
        body = kw["body"]
        return {(namespace, name): _secret_digests(body)}

    @kopf.index(GROUP, VERSION, "modelpools", id="pool_index", registry=registry)
    def pool_index(**kw: Any) -> Any:
        namespace = kw["namespace"]
        body = kw["body"]
        return {namespace: _plain(body)}

    @kopf.index("v1", "pods", labels={LABEL_POOL: kopf.PRESENT}, id="pod_index", registry=registry)
    def pod_index(**kw: Any) -> Any:
        namespace = kw["namespace"]
        body = kw["body"]
        labels = kw["labels"]
        return {(namespace, labels[LABEL_POOL]): _pod_view(body)}

    # --- triggers ----------------------------------------------------------------------------

    @kopf.on.event(GROUP, VERSION, "modelpools", id="pool_event", registry=registry)
    async def pool_event(**kw: Any) -> None:
        event = kw["event"]
        namespace = kw["namespace"]
        name = kw["name"]
        meta = kw["meta"]
        if event.get("type") == "DELETED":
            seen.forget("pool", namespace, name)
            await cleanup_pool(op, namespace, name)
            await op.publisher.request(namespace)
            return
        if seen.changed("pool", namespace, name, _essence(meta)):
            try:
                await op.pools.request((namespace, name))
            except Exception:
                seen.forget("pool", namespace, name)  # let the next event retry
                raise

    @kopf.timer(
        GROUP,
        VERSION,
        "modelpools",
        interval=cfg.measure_interval,
        id="pool_timer",
        registry=registry,
    )
    async def pool_timer(**kw: Any) -> None:
        namespace = kw["namespace"]
        name = kw["name"]
        await op.pools.request((namespace, name))

    @kopf.on.event(GROUP, VERSION, "tierpolicies", id="policy_event", registry=registry)
    async def policy_event(**kw: Any) -> None:
        event = kw["event"]
        namespace = kw["namespace"]
        name = kw["name"]
        meta = kw["meta"]
        deleted = event.get("type") == "DELETED"
        if not seen.changed("policy", namespace, name, (*_essence(meta), deleted)):
            return
        for body in list(op.indices.pools.get(namespace, ())):
            if ((body.get("spec") or {}).get("tierPolicyRef") or {}).get("name") == name:
                await op.pools.request((namespace, body["metadata"]["name"]))
        await op.publisher.request(namespace)

    @kopf.on.event(GROUP, VERSION, "tenantbudgets", id="budget_event", registry=registry)
    async def budget_event(**kw: Any) -> None:
        event = kw["event"]
        namespace = kw["namespace"]
        name = kw["name"]
        meta = kw["meta"]
        deleted = event.get("type") == "DELETED"
        if seen.changed("budget", namespace, name, (*_essence(meta), deleted)):
            await op.publisher.request(namespace)

    @kopf.on.event("v1", "secrets", id="secret_event", registry=registry)
    async def secret_event(**kw: Any) -> None:
        event = kw["event"]
        namespace = kw["namespace"]
        name = kw["name"]
        body = kw["body"]
        referenced = any(
            ((b.get("spec") or {}).get("apiKeySecretRef") or {}).get("name") == name
            for b in op.indices.budgets.get(namespace, ())
        )
        digests = (event.get("type"), json.dumps(_secret_digests(body), sort_keys=True))
        if referenced and seen.changed("secret", namespace, name, digests):
            await op.publisher.request(namespace)

    @kopf.on.event(
        "v1", "pods", labels={LABEL_POOL: kopf.PRESENT}, id="pod_event", registry=registry
    )
    async def pod_event(**kw: Any) -> None:
        event = kw["event"]
        namespace = kw["namespace"]
        name = kw["name"]
        body = kw["body"]
        view = (event.get("type"), _pod_view(body))
        if seen.changed("pod", namespace, name, view):
            await op.publisher.request(namespace)

    @kopf.on.event(
        "apps",
        "v1",
        "deployments",
        labels={LABEL_POOL: kopf.PRESENT, LABEL_MANAGED_BY: MANAGED_BY},
        id="deployment_event",
        registry=registry,
    )
    async def deployment_event(**kw: Any) -> None:
        event = kw["event"]
        namespace = kw["namespace"]
        name = kw["name"]
        body = kw["body"]
        labels = kw["labels"]
        status = body.get("status") or {}
        counts = (event.get("type"), status.get("readyReplicas"), status.get("replicas"))
        if event.get("type") != "DELETED" and seen.changed("deployment", namespace, name, counts):
            pool = labels[LABEL_POOL]
            if await op.kube.get(kube.MODELPOOLS, namespace, pool) is not None:
                await op.pools.request((namespace, pool))

    return registry
