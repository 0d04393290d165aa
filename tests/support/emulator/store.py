"""The emulator's storage: objects, one resourceVersion counter, the event log and watches.

Why it exists: a kopf operator relies on what etcd and the API server's storage layer
give it - a global resourceVersion, an append-only log that a watch resumes from
(``?resourceVersion=N``), 409 on a stale write, ``/status`` isolated from the spec,
finalizers that hold a deletion, garbage collection by ownerReferences - and this is where
the emulator keeps those promises. It knows nothing of HTTP (:mod:`.server` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import json
import random
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

import jsonpatch

from kvpool.api.validation.schema import apply_defaults
from tests.support.emulator.admission import admit
from tests.support.emulator.resources import (
    BUILTIN_RESOURCES,
    CRD_KEY,
    ApiResource,
    Obj,
    kube_error,
    resources_of_crd,
)
from tests.support.emulator.selectors import object_selector

MERGE_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the API server uses for generateName


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# What a real API server allows: a ConfigMap's or Secret's data (keys and values) up to
# 1 MiB (validation, 422 "Too long"), and any stored object up to etcd's 1.5 MiB request
# limit (413 here; a real server answers "etcdserver: request is too large").
DATA_LIMIT_BYTES = 1024 * 1024
OBJECT_LIMIT_BYTES = 1536 * 1024


def check_size(resource: ApiResource, obj: Obj) -> None:
    """Refuse an object a real API server would not store, with its error text."""
    if resource.kind in ("ConfigMap", "Secret"):
        size = 0
        for field in ("data", "binaryData", "stringData"):
            for key, value in (obj.get(field) or {}).items():
                size += len(str(key).encode()) + len(str(value).encode())
        if size > DATA_LIMIT_BYTES:
            name = obj["metadata"].get("name", "")
            raise kube_error(
                422,
                "Invalid",
                f'{resource.kind} "{name}" is invalid: []: Too long: may not be more than '
                f"{DATA_LIMIT_BYTES} bytes (this one holds {size})",
                name=name,
                kind=resource.plural,
            )
    stored = len(json.dumps(obj, separators=(",", ":")).encode())
    if stored > OBJECT_LIMIT_BYTES:
        raise kube_error(
            413,
            "RequestEntityTooLarge",
            f"etcdserver: request is too large ({stored} bytes, limit {OBJECT_LIMIT_BYTES})",
        )


def _without(obj: Obj, *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One change in the event log; ``old`` lets a selector-filtered watch see objects leave."""

    rv: int
    store_key: tuple[str, str]
    type: str  # ADDED | MODIFIED | DELETED
    old: Obj | None
    new: Obj


@dataclasses.dataclass
class ObjectStore:
    """Objects by ((group, plural), namespace or "", name), the watch log, the served
    resources. Call it on the emulator's loop."""

    api_resources: dict[tuple[str, str, str], ApiResource] = dataclasses.field(default_factory=dict)
    objects_by_key: dict[tuple[tuple[str, str], str, str], Obj] = dataclasses.field(
        default_factory=dict
    )
    events: list[WatchEvent] = dataclasses.field(default_factory=list)
    resource_version: int = 1
    closing: bool = False  # set once: every watch ends
    _changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # per change

    def __post_init__(self) -> None:
        for resource in BUILTIN_RESOURCES:
            self.api_resources[(resource.group, resource.version, resource.plural)] = resource
        for ns in ("default", "kube-system"):
            self.create(self.resource("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    def close_watches(self) -> None:
        """End every open watch (before the server stops, so that it stops at once)."""
        self.closing = True
        self._wake_watches()

    def register_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve a CRD's resources and store the CRD object (as a POST of the CRD would)."""
        for resource in resources_of_crd(crd):
            self.api_resources[(resource.group, resource.version, resource.plural)] = resource
        if (CRD_KEY, "", crd["metadata"]["name"]) not in self.objects_by_key:
            crds = self.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            self.create(crds, None, copy.deepcopy(dict(crd)))

    def put(self, api_version: str, plural: str, body: Mapping[str, Any]) -> Obj:
        """Write an object straight into storage: no validation, no pruning, no admission.

        This is how an object stored before a CRD upgrade, or by a server that does not
        enforce CEL, reaches an operator (schema defaults are applied, as a server applies
        them when it reads an object from etcd); tests use it to show what the operator does with
        objects the API server would have refused. Creates, or replaces all but identity
        (uid, creationTimestamp, finalizers, deletionTimestamp) and ``status``; the
        generation bumps when anything outside metadata and status changed.
        """
        group, _, version = api_version.rpartition("/")
        resource = self.resource(group, version, plural)
        if resource.schema is not None:  # defaults apply on every read, as from etcd
            body = apply_defaults(dict(resource.schema), dict(body))
        meta = dict(body.get("metadata") or {})
        namespace = (meta.get("namespace") or "default") if resource.namespaced else None
        old = self.objects_by_key.get(self._key(resource, namespace, meta["name"]))
        if old is None:
            return self.create(resource, namespace, copy.deepcopy(dict(body)))
        new = copy.deepcopy(_without(dict(body), "status"))
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        kept = ("uid", "creationTimestamp", "generation", "finalizers", "deletionTimestamp")
        new["metadata"] = {**meta, **{k: old["metadata"][k] for k in kept if k in old["metadata"]}}
        if resource.namespaced:
            new["metadata"]["namespace"] = old["metadata"]["namespace"]
        else:
            new["metadata"].pop("namespace", None)
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        if _without(new, "metadata", "status") != _without(old, "metadata", "status"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        return self._record(resource, "MODIFIED", old, new)

    def resource(self, group: str, version: str, plural: str) -> ApiResource:
        resource = self.api_resources.get((group, version, plural))
        if resource is None:
            raise kube_error(
                404,
                "NotFound",
                f"the server could not find the requested resource "
                f"({group or 'core'}/{version} {plural})",
            )
        return resource

    def _key(self, resource: ApiResource, namespace: str | None, name: str) -> Any:
        return (resource.store_key, namespace or "", name)

    def get(self, resource: ApiResource, namespace: str | None, name: str) -> Obj:
        obj = self.objects_by_key.get(self._key(resource, namespace, name))
        if obj is None:
            raise kube_error(
                404,
                "NotFound",
                f'{resource.plural} "{name}" not found',
                name=name,
                kind=resource.plural,
                group=resource.group,
            )
        return obj

    def _record(self, resource: ApiResource, type_: str, old: Obj | None, new: Obj) -> Obj:
        """Bump the global resourceVersion, store ``new`` and log the event; returns ``new``."""
        self.resource_version += 1
        new["metadata"]["resourceVersion"] = str(self.resource_version)
        key = self._key(resource, new["metadata"].get("namespace"), new["metadata"]["name"])
        if type_ == "DELETED":
            del self.objects_by_key[key]
        else:
            self.objects_by_key[key] = new
        self.events.append(WatchEvent(self.resource_version, resource.store_key, type_, old, new))
        self._wake_watches()
        if type_ == "DELETED":
            self._collect_garbage(new["metadata"].get("uid"))
        return new

    def _collect_garbage(self, owner_uid: str | None) -> None:
        """Delete the dependents of a deleted owner (background cascading deletion, as the
        garbage collector does; dependents with finalizers get a deletionTimestamp)."""
        if not owner_uid:
            return
        by_store = {r.store_key: r for r in self.api_resources.values()}
        for (store_key, ns, name), obj in list(self.objects_by_key.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            owned = any(ref.get("uid") == owner_uid for ref in owners)
            if owned and store_key in by_store and (store_key, ns, name) in self.objects_by_key:
                self.delete(by_store[store_key], ns or None, name)

    def _wake_watches(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def create(
        self,
        resource: ApiResource,
        namespace: str | None,
        body: Obj,
        field_validation: str | None = "skip",
    ) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(NAME_CHARS, k=5))
        if not meta.get("name"):
            raise kube_error(422, "Invalid", "metadata.name or metadata.generateName is required")
        if resource.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
            if meta.setdefault("namespace", namespace) != namespace:
                raise kube_error(400, "BadRequest", "metadata.namespace does not match the URL")
        else:
            meta.pop("namespace", None)
        if self._key(resource, namespace, meta["name"]) in self.objects_by_key:
            raise kube_error(
                409,
                "AlreadyExists",
                f'{resource.plural} "{meta["name"]}" already exists',
                name=meta["name"],
                kind=resource.plural,
            )
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            meta.pop(field, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        if "status" in resource.subresources:
            obj.pop("status", None)
        obj = admit(resource, obj, field_validation)
        check_size(resource, obj)
        if resource.store_key == CRD_KEY:
            for served in resources_of_crd(obj):
                self.api_resources[(served.group, served.version, served.plural)] = served
        return self._record(resource, "ADDED", None, obj)

    def patch(
        self,
        resource: ApiResource,
        namespace: str | None,
        name: str,
        subresource: str | None,
        content_type: str,
        patch: Any,
        field_validation: str | None = "skip",
    ) -> Obj:
        old = self.get(resource, namespace, name)
        if subresource not in (None, *resource.subresources):
            raise kube_error(404, "NotFound", f"{resource.plural} has no subresource {subresource}")
        if content_type in MERGE_PATCH_TYPES:
            patched = merge_patch(old, patch)
        elif content_type == "application/json-patch+json":
            try:
                patched = jsonpatch.apply_patch(old, patch)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise kube_error(422, "Invalid", f"the JSON patch cannot be applied: {e}") from e
        else:
            raise kube_error(
                415,
                "UnsupportedMediaType",
                f"{content_type or 'no Content-Type'}: "
                "only merge-patch and JSON patch are emulated",
            )
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
            raise kube_error(422, "Invalid", "the patched object is not an object with metadata")
        sent_rv = patched["metadata"].get("resourceVersion")
        if sent_rv not in (None, "") and sent_rv != old["metadata"]["resourceVersion"]:
            raise kube_error(
                409,
                "Conflict",
                f"Operation cannot be fulfilled on {resource.plural} "
                f'"{name}": the object has been modified; please apply your changes '
                "to the latest version and try again",
                name=name,
            )
        new = admit(
            resource, self._isolate(resource, subresource, old, patched), field_validation, old
        )
        if new == old:
            return old
        check_size(resource, new)
        if _without(new, "metadata", "status") != _without(old, "metadata", "status"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        finalizers = new["metadata"].get("finalizers") or []
        if old["metadata"].get("deletionTimestamp"):
            if set(finalizers) - set(old["metadata"].get("finalizers") or []):
                raise kube_error(
                    422, "Invalid", "no new finalizers can be added if the object is being deleted"
                )
            if not finalizers:
                return self._record(resource, "DELETED", old, new)
        return self._record(resource, "MODIFIED", old, new)

    @staticmethod
    def _isolate(resource: ApiResource, subresource: str | None, old: Obj, patched: Obj) -> Obj:
        """The new object: status from /status only, spec never from /status, identity kept."""
        if subresource == "status":
            new = _without(old, "status")
            if "status" in patched:
                new["status"] = patched["status"]
            new["metadata"] = dict(old["metadata"])
            return copy.deepcopy(new)
        new = copy.deepcopy(_without(patched, "status"))
        if "status" in resource.subresources:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
        elif "status" in patched:
            new["status"] = patched["status"]
        immutable = (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
            "resourceVersion",
        )
        for field in immutable:
            new["metadata"].pop(field, None)
            if field in old["metadata"]:
                new["metadata"][field] = old["metadata"][field]
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        return new

    def delete(self, resource: ApiResource, namespace: str | None, name: str) -> Obj:
        old = self.get(resource, namespace, name)
        if not old["metadata"].get("finalizers"):
            return self._record(resource, "DELETED", old, copy.deepcopy(old))
        if old["metadata"].get("deletionTimestamp"):
            return old
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = _now()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        return self._record(resource, "MODIFIED", old, new)

    def list_objects(
        self, resource: ApiResource, namespace: str | None, params: Mapping[str, str]
    ) -> list[Obj]:
        matches = object_selector(params)
        return [
            obj
            for (store_key, ns, _), obj in sorted(self.objects_by_key.items())
            if store_key == resource.store_key and namespace in (None, ns) and matches(obj)
        ]

    def list_body(self, resource: ApiResource, items: list[Obj]) -> Obj:
        return {
            "apiVersion": resource.api_version,
            "kind": f"{resource.kind}List",
            "metadata": {"resourceVersion": str(self.resource_version)},
            "items": items,
        }

    def watch(
        self,
        resource: ApiResource,
        namespace: str | None,
        name: str | None,
        params: Mapping[str, str],
    ) -> AsyncGenerator[Obj, None]:
        """Check the watch parameters now (a 400 is a plain answer), then follow the log."""
        matches = object_selector(params)
        since = params.get("resourceVersion", "")
        if since and not since.isdigit():
            raise kube_error(400, "BadRequest", f"resourceVersion {since!r} is not a number")
        try:
            timeout = float(params.get("timeoutSeconds") or 0) or None
        except ValueError as e:
            raise kube_error(400, "BadRequest", "timeoutSeconds is not a number") from e
        initial = params.get("sendInitialEvents") == "true"
        return self._follow(resource, namespace, name, matches, since, timeout, initial)

    async def _follow(
        self,
        resource: ApiResource,
        namespace: str | None,
        name: str | None,
        matches: Callable[[Obj], bool],
        since: str,
        timeout: float | None,
        send_initial_events: bool,
    ) -> AsyncGenerator[Obj, None]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout

        def relevant(obj: Obj) -> bool:
            meta = obj["metadata"]
            return (
                namespace in (None, meta.get("namespace"))
                and name in (None, meta["name"])
                and matches(obj)
            )

        if since in ("", "0"):  # list what exists now, then follow the log from here
            position, snapshot_rv = len(self.events), self.resource_version
            initial = [o for o in self.list_objects(resource, namespace, {}) if relevant(o)]
            for obj in initial:
                yield {"type": "ADDED", "object": obj}
            if send_initial_events:
                meta = {
                    "resourceVersion": str(snapshot_rv),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                }
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": resource.kind,
                        "apiVersion": resource.api_version,
                        "metadata": meta,
                    },
                }
        else:
            after = int(since)
            position = next(
                (i for i, e in enumerate(self.events) if e.rv > after), len(self.events)
            )

        while not self.closing:
            changed = self._changed  # set by the next change, even one made while we yield below
            while position < len(self.events):
                event, position = self.events[position], position + 1
                if event.store_key != resource.store_key:
                    continue
                was, now = event.old is not None and relevant(event.old), relevant(event.new)
                if event.type == "DELETED":
                    was, now = was or now, False
                if was and now:
                    yield {"type": event.type, "object": event.new}
                elif now:
                    yield {"type": "ADDED", "object": event.new}
                elif was:
                    yield {"type": "DELETED", "object": event.new}
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)
