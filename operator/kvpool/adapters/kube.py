"""Kubernetes API I/O of the operator: read, create, merge-patch, JSON-patch, delete.

Why it exists: the reconcile must stay a short orchestration of pure decisions, so every
API call lives here behind a small async client (aiohttp, one connection pool). The
operator writes only with create, merge-patch (``application/merge-patch+json``) and
JSON patch: no PUT/replace and no server-side apply (see GUIDE.md: the test API server
has neither, and neither is needed).

Failure policy (tested): 429 and 5xx answers and connection errors are retried with
exponential backoff (honouring ``Retry-After``); a 409 on create means the object exists
(a restarted operator finds what it created: names are deterministic) and is turned into
a read-then-patch; other errors raise :class:`ApiError` to the caller, whose reconcile is
retried by kopf.

Each ``apply_*`` owns one kind of child and writes only when the child's
``kvpool.dev/spec-hash`` annotation (or the Deployment's replica count) differs from the
desired object, or when a field kvpool owns was edited by hand (drift, compared tolerating
server defaults: :mod:`kvpool.domain.drift`), so an unchanged plan makes no writes and
triggers no watch events.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from kvpool.api.admission_config import CONFIGMAP_KEY, AdmissionConfig
from kvpool.domain.compile import config_hash
from kvpool.domain.drift import find_drift
from kvpool.domain.leadership import LeaseRecord
from kvpool.domain.manifests import (
    ANNOTATION_CONFIG_HASH,
    ANNOTATION_SPEC_HASH,
    LABEL_MANAGED_BY,
    LABEL_POOL,
    MANAGED_BY,
)

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
USER_AGENT = "kvpool-operator"  # tells the operator's own requests apart in audit logs


@dataclass(frozen=True)
class Resource:
    """A REST resource: API group ('' for core), version and plural."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        """The URL path of the collection, or of one object (and a subresource)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


MODELPOOLS = Resource("kvpool.dev", "v1alpha1", "modelpools")
TIERPOLICIES = Resource("kvpool.dev", "v1alpha1", "tierpolicies")
TENANTBUDGETS = Resource("kvpool.dev", "v1alpha1", "tenantbudgets")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
SERVICES = Resource("", "v1", "services")
PODS = Resource("", "v1", "pods")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
PDBS = Resource("policy", "v1", "poddisruptionbudgets")
LEASES = Resource("coordination.k8s.io", "v1", "leases")
CHILD_RESOURCES = (DEPLOYMENTS, SERVICES, PDBS)


class ApiError(Exception):
    """An API answer the caller must handle (after retries)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class KubeConnection:
    """Where and how to reach the API server."""

    server: str  # e.g. https://10.96.0.1:443 or http://127.0.0.1:PORT
    token: str | None = None  # bearer token (kubeconfig)
    token_file: Path | None = None  # re-read per request (in-cluster tokens rotate)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True


def load_connection(kubeconfig: str | None = None, context: str | None = None) -> KubeConnection:
    """Connection settings from a kubeconfig (explicit, ``$KUBECONFIG``, ~/.kube/config),
    else from the in-cluster service account."""
    from kubernetes import client, config  # the official client only parses the config

    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    default = Path.home() / ".kube" / "config"
    if path or default.exists():
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path or str(default), context=context, client_configuration=cfg
        )
        token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        if token and token.lower().startswith("bearer "):
            token = token[7:]
        return KubeConnection(
            server=cfg.host.rstrip("/"),
            token=token,
            ca_file=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            verify=bool(cfg.verify_ssl),
        )
    config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return KubeConnection(server=cfg.host.rstrip("/"), token_file=SA_TOKEN, ca_file=cfg.ssl_ca_cert)


class KubeClient:
    """A small async Kubernetes client (create, get, list, patch, delete) with retries."""

    def __init__(
        self, conn: KubeConnection, *, attempts: int = 6, backoff: float = 0.2, timeout: float = 15
    ) -> None:
        self.conn = conn
        self.attempts = attempts
        self.backoff = backoff
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False  # after close(): no new session, no retries (shutting down)

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.conn.server.startswith("https"):
            return False
        if not self.conn.verify:
            return False
        ctx = ssl.create_default_context(cafile=self.conn.ca_file)
        if self.conn.cert_file and self.conn.key_file:
            ctx.load_cert_chain(self.conn.cert_file, self.conn.key_file)
        return ctx

    async def session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ApiError(0, "the client is closed (the operator is stopping)")
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=16)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def headers(self, content_type: str | None) -> dict[str, str]:
        """Request headers: JSON, our User-Agent, the bearer token (re-read if from a file)."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        token = self.conn.token
        if self.conn.token_file is not None:
            token = self.conn.token_file.read_text().strip()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> JsonObject | None:
        """One API call with retries on 429/5xx/connection errors; 404 -> None."""
        data = json.dumps(body) if body is not None else None
        ctype = content_type or ("application/json" if body is not None else None)
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                session = await self.session()
                async with session.request(
                    method,
                    self.conn.server + path,
                    data=data,
                    params=params,
                    headers=self.headers(ctype),
                ) as response:
                    text = await response.text()
                    if response.status == 404:
                        return None
                    if response.status < 400:
                        return json.loads(text) if text else {}
                    if response.status not in RETRY_STATUSES or attempt == self.attempts:
                        raise ApiError(response.status, f"{method} {path}: {text[:300]}")
                    retry_after = response.headers.get("Retry-After", "")
                    wait = float(retry_after) if retry_after.isdigit() else delay
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                if attempt == self.attempts or self._closed:
                    raise ApiError(0, f"{method} {path}: {exc!r}") from exc
                wait = delay
            log.info("kube %s %s: retry %d in %.1fs", method, path, attempt, wait)
            await asyncio.sleep(min(wait, 5.0))
            delay *= 2
        raise AssertionError("unreachable")

    async def get(self, resource: Resource, namespace: str | None, name: str) -> JsonObject | None:
        return await self.request("GET", resource.path(namespace, name))

    async def list_objects(
        self,
        resource: Resource,
        namespace: str | None,
        labels: Mapping[str, str] | None = None,
        selector: str | None = None,
    ) -> list[JsonObject]:
        """Objects of a namespace (None: all), by labels (equality) or a raw selector."""
        if labels:
            selector = ",".join(f"{k}={v}" for k, v in labels.items())
        params = {"labelSelector": selector} if selector else None
        result = await self.request("GET", resource.path(namespace), params=params)
        return list((result or {}).get("items", []))

    async def create(self, resource: Resource, namespace: str, body: JsonObject) -> JsonObject:
        result = await self.request("POST", resource.path(namespace), body)
        if result is None:
            raise ApiError(404, f"namespace {namespace} or {resource.plural} not found")
        return result

    async def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: JsonObject, sub: str = ""
    ) -> JsonObject | None:
        return await self.request(
            "PATCH", resource.path(namespace, name, sub), patch, content_type=MERGE_PATCH
        )

    async def json_patch(
        self, resource: Resource, namespace: str, name: str, ops: list[JsonObject]
    ) -> JsonObject | None:
        return await self.request(
            "PATCH", resource.path(namespace, name), ops, content_type=JSON_PATCH
        )

    async def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete an object; False when it was already gone."""
        return await self.request("DELETE", resource.path(namespace, name)) is not None


# --- applying owned children -----------------------------------------------------------------


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def _replace_ops(
    current: JsonObject, desired: JsonObject, owned: tuple[str, ...]
) -> list[JsonObject]:
    """JSON-patch ops setting our labels/annotations (others' kept) and replacing owned parts.

    Replacing (not merging) the owned top-level fields is what removes a field the spec no
    longer sets, e.g. a dropped nodeSelector.
    """
    meta, want = current.get("metadata") or {}, desired["metadata"]
    ops: list[JsonObject] = []
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
    client: KubeClient,
    resource: Resource,
    desired: JsonObject,
    *,
    owned: tuple[str, ...] = ("spec",),
    hash_annotation: str = ANNOTATION_SPEC_HASH,
    drift: Callable[[JsonObject, JsonObject], list[str]] | None = None,
) -> tuple[JsonObject, str]:
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
        except ApiError as exc:
            if exc.status != 409:
                raise
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


def owned_drift(current: JsonObject, desired: JsonObject, owned: tuple[str, ...]) -> list[str]:
    """Fields kvpool owns (the ``owned`` parts and its labels) that no longer match;
    ``spec.replicas`` is compared on its own (scaling is not drift)."""
    want: JsonObject = {field: desired.get(field) for field in owned}
    spec = want.get("spec")
    if isinstance(spec, dict):
        want["spec"] = {k: v for k, v in spec.items() if k != "replicas"}
    want["metadata"] = {"labels": (desired.get("metadata") or {}).get("labels") or {}}
    return find_drift(want, current)


async def apply_deployment(client: KubeClient, desired: JsonObject) -> tuple[JsonObject, str]:
    """The engine Deployment of one track (template by hash, replicas compared on their own)."""
    return await apply_owned(client, DEPLOYMENTS, desired)


async def apply_service(client: KubeClient, desired: JsonObject) -> tuple[JsonObject, str]:
    """The Service of one track."""
    return await apply_owned(client, SERVICES, desired)


async def apply_pdb(client: KubeClient, desired: JsonObject) -> tuple[JsonObject, str]:
    """The PodDisruptionBudget of a pool."""
    return await apply_owned(client, PDBS, desired)


async def apply_admission_configmap(client: KubeClient, desired: JsonObject) -> str:
    """The namespace's compiled admission ConfigMap (rewritten when its config hash differs,
    or when its content no longer hashes to it: a hand-edited config is put back)."""
    _, action = await apply_owned(
        client,
        CONFIGMAPS,
        desired,
        owned=("data",),
        hash_annotation=ANNOTATION_CONFIG_HASH,
        drift=_config_drift,
    )
    return action


def _config_drift(current: JsonObject, desired: JsonObject) -> list[str]:
    """The stored config no longer hashes to kvpool's config-hash (``generatedAt`` aside)."""
    text = (current.get("data") or {}).get(CONFIGMAP_KEY)
    try:
        stored = config_hash(AdmissionConfig.model_validate_json(text or ""))
    except ValueError:
        return [f"data.{CONFIGMAP_KEY}"]
    want = _annotation(desired, ANNOTATION_CONFIG_HASH)
    return [] if stored == want else [f"data.{CONFIGMAP_KEY}"]


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
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
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


async def create_event(
    client: KubeClient,
    involved: Mapping[str, Any],
    type_: str,
    reason: str,
    message: str,
    now: str,
    component: str = "kvpool-operator",
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
        "message": message[:1024],
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


# --- leader election Lease -------------------------------------------------------------------


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
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
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


# --- label-selected watches ------------------------------------------------------------------

WatchHandler = Callable[[str, JsonObject], Awaitable[None]]
ListHandler = Callable[[list[JsonObject]], Awaitable[None]]


class WatchExpiredError(Exception):
    """The API server no longer has the resourceVersion a watch resumed from (410 Gone)."""


@dataclass
class LabelWatch:
    """List, then watch, the objects of one resource that match a label selector.

    Why not kopf's watch: kopf filters labels on the client side, so it would list and
    watch every Secret and Pod the RBAC allows; here the selector goes to the API server,
    which sends nothing else. :meth:`prime` lists (the caller fills its cache before
    acting); :meth:`follow` watches from the listed resourceVersion forever, relisting on
    410 Gone or a broken stream (``on_list`` then receives the complete current set, so a
    deletion missed meanwhile is not kept).
    """

    client: KubeClient
    resource: Resource
    namespace: str | None  # None: all namespaces
    selector: str  # labelSelector, e.g. "kvpool.dev/api-key"
    on_event: WatchHandler  # (ADDED | MODIFIED | DELETED, object)
    on_list: ListHandler  # the complete matching set after a (re)list
    timeout: int = 300  # seconds the server keeps one watch request open
    resource_version: str | None = None

    async def prime(self) -> None:
        """List the matching objects and hand them to ``on_list``."""
        listing = await self.client.request(
            "GET", self.resource.path(self.namespace), params={"labelSelector": self.selector}
        )
        listing = listing or {}
        self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
        await self.on_list(list(listing.get("items", [])))

    async def follow(self) -> None:
        """Watch until cancelled, resuming after each server timeout, relisting when needed."""
        delay = 0.5
        while True:
            try:
                if self.resource_version is None:
                    await self.prime()
                await self._watch_once()
                delay = 0.5
            except WatchExpiredError:
                self.resource_version = None
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.info("watch %s (%s): %r; relisting", self.resource.plural, self.selector, exc)
                self.resource_version = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _watch_once(self) -> None:
        params = {
            "watch": "true",
            "labelSelector": self.selector,
            "resourceVersion": self.resource_version or "",
            "timeoutSeconds": str(self.timeout),
            "allowWatchBookmarks": "true",
        }
        session = await self.client.session()
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.timeout + 30)
        url = self.client.conn.server + self.resource.path(self.namespace)
        headers = self.client.headers(None)
        async with session.get(url, params=params, headers=headers, timeout=timeout) as rsp:
            if rsp.status == 410:
                raise WatchExpiredError()
            if rsp.status >= 400:
                raise ApiError(rsp.status, (await rsp.text())[:300])
            async for line in rsp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpiredError()
                    raise ApiError(int(obj.get("code") or 0), str(obj.get("message")))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    await self.on_event(kind, obj)
