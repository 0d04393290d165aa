"""The kopf handlers of the operator: they keep the cache current and decide *what* to
reconcile and when.

Why it exists: kopf tells us that something changed; the work itself (observe, plan,
apply, status) is in :mod:`kvpool.controller.pool`, the config in
:mod:`kvpool.controller.publisher`. Every trigger funnels into two coalescing queues - per
pool and per namespace - so a burst of changes costs one reconcile, and two triggers
never reconcile one pool concurrently.

Re-plan triggers:

- ModelPool: a change of generation, labels or annotations, or deletion (status writes
  are not changes: the operator's own status patches must not re-trigger it);
- TierPolicy: every pool of the namespace that references it, then the namespace config;
- TenantBudget: the namespace config;
- engine Deployments (labels ``kvpool.dev/pool`` and ``app.kubernetes.io/managed-by=kvpool``,
  selected by the API server: kopf's ``labels=`` filter alone is client-side, so the watch
  would carry every Deployment of the cluster): their ready/desired counts;
- (outside kopf, :mod:`kvpool.controller.watches`: Secrets labelled ``kvpool.dev/api-key``
  that a TenantBudget references, engine Pods labelled ``kvpool.dev/pool`` -> the config);
- a timer per pool (``--measure-interval``, default 15 s): a new measurement.

The cache (:mod:`kvpool.controller.cache`) is filled by one list per kind in the start-up
handler, before kopf starts watching, and updated by every event below. Liveness is
kopf's; with ``--peering`` (instead of leader election) kopf pauses a standby replica.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from kvpool.api.common import GROUP, VERSION
from kvpool.controller.wiring import Operator
from kvpool.domain.manifests import (
    FINALIZER_OPERATOR,
    LABEL_MANAGED_BY,
    LABEL_POOL,
    LABEL_TRACK,
    MANAGED_BY,
)

log = logging.getLogger(__name__)

# The engine Deployments the operator renders (build_labels), and no other Deployment.
ENGINE_DEPLOYMENT_SELECTOR = f"{LABEL_POOL},{LABEL_MANAGED_BY}={MANAGED_BY}"


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
    """What makes a change worth acting on: spec (generation), labels, our annotations."""
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith("kopf.")
    }
    return (
        meta.get("generation"),
        json.dumps(meta.get("labels") or {}, sort_keys=True),
        json.dumps(annotations, sort_keys=True),
        bool(meta.get("deletionTimestamp")),
    )


def _event(kw: Mapping[str, Any]) -> tuple[str, str, Any]:
    """(namespace, name, body or None when deleted) of an on.event call."""
    body = None if kw["event"].get("type") == "DELETED" else kw["body"]
    return kw["namespace"] or "default", kw["name"], body


def build_registry(op: Operator) -> kopf.OperatorRegistry:
    """All handlers of the operator, bound to one :class:`~kvpool.controller.wiring.Operator`."""
    registry = kopf.OperatorRegistry()
    _register_lifecycle(registry, op)
    _register_triggers(registry, op, Fingerprints())
    return registry


def _configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER_OPERATOR
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="kopf.kvpool.dev"
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kopf.kvpool.dev"
    )
    settings.posting.enabled = False  # the operator posts its own, meaningful Events
    settings.watching.server_timeout = 300
    settings.watching.label_selectors["apps", "deployments"] = ENGINE_DEPLOYMENT_SELECTOR
    settings.networking.request_timeout = 30


def _register_lifecycle(registry: kopf.OperatorRegistry, op: Operator) -> None:
    """Login, start-up (settings, cache, watches, election), cleanup and the probe."""
    state = op.state

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        conn = state.kube.conn
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
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        _configure(settings)
        await op.start()

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await op.stop()

    @kopf.on.probe(id="metrics", registry=registry)
    def probe(**_: Any) -> dict[str, Any]:
        prometheus = state.config.prometheus_url
        return {"prometheus": prometheus, "lastSnapshot": state.snapshots.last_success}


def _register_triggers(registry: kopf.OperatorRegistry, op: Operator, seen: Fingerprints) -> None:
    """The events and the timer that request reconciles and publishes (the module docstring)."""
    state = op.state
    cfg, cache = state.config, state.cache

    @kopf.on.event(GROUP, VERSION, "modelpools", id="pool_event", registry=registry)
    async def pool_event(**kw: Any) -> None:
        ns, name, body = _event(kw)
        cache.put_pool((ns, name), body)
        if body is None:
            seen.forget("pool", ns, name)
            await op.pool_deleted(ns, name)
        elif seen.changed("pool", ns, name, _essence(kw["meta"])):
            try:
                await op.pools.request((ns, name))
            except Exception:
                seen.forget("pool", ns, name)  # let the next event retry
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
        await op.pools.request((kw["namespace"], kw["name"]))

    @kopf.on.event(GROUP, VERSION, "tierpolicies", id="policy_event", registry=registry)
    async def policy_event(**kw: Any) -> None:
        ns, name, body = _event(kw)
        cache.put_policy((ns, name), body)
        if not seen.changed("policy", ns, name, (*_essence(kw["meta"]), body is None)):
            return
        for pool in list(cache.pools.get(ns, {}).values()):
            if ((pool.get("spec") or {}).get("tierPolicyRef") or {}).get("name") == name:
                await op.pools.request((ns, pool["metadata"]["name"]))
        await op.publisher.request(ns)

    @kopf.on.event(GROUP, VERSION, "tenantbudgets", id="budget_event", registry=registry)
    async def budget_event(**kw: Any) -> None:
        ns, name, body = _event(kw)
        cache.put_budget((ns, name), body)
        if seen.changed("budget", ns, name, (*_essence(kw["meta"]), body is None)):
            await op.publisher.request(ns)

    @kopf.on.event(
        "apps",
        "v1",
        "deployments",
        labels={LABEL_POOL: kopf.PRESENT, LABEL_MANAGED_BY: MANAGED_BY},
        id="deployment_event",
        registry=registry,
    )
    async def deployment_event(**kw: Any) -> None:
        ns, _, body = _event(kw)
        if body is None:
            return
        ready = int((body.get("status") or {}).get("readyReplicas") or 0)
        pool = kw["labels"][LABEL_POOL]
        known = state.statuses.get((ns, pool))
        canary = kw["labels"].get(LABEL_TRACK) == "canary"
        counts = known.replicas if known is not None else None
        recorded = (counts.canary if canary else counts.ready) if counts is not None else None
        if recorded is not None and recorded != ready and cache.pools.get(ns, {}).get(pool):
            await op.pools.request((ns, pool))  # readiness changed since the last status
