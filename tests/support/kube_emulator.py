"""An in-memory Kubernetes API server for tests: kmock 0.8 plus what a kopf operator needs.

There is no kube-apiserver on our machines, and stock ``kmock.KubernetesEmulator`` breaks
a kopf operator (watches replay everything and ignore ``?resourceVersion``, objects lack
uid/resourceVersion/generation, ``/api/v1/namespaces`` answers 500, ``/status`` is not
isolated, no 409 on a stale resourceVersion). :class:`KubeEmulator` keeps kmock's request
log and reaction DSL (``emulator['patch', kmock.resource(...)] << 503`` still injects faults,
and requests a user reaction answers change no state) but serves every Kubernetes path
itself, as one low-priority fallback, with these semantics:

- one global resourceVersion counter and an append-only event log; a watch replays the
  log after ``?resourceVersion=N`` (or lists current objects as ADDED when none is given),
  honours ``timeoutSeconds``, ``labelSelector`` and ``sendInitialEvents``;
- create answers 201, fills uid/resourceVersion/creationTimestamp/generation, supports
  ``generateName`` and drops ``status`` when the resource has a status subresource;
- PATCH takes merge-patch (strategic merge patch is treated as merge-patch) and JSON patch;
  the main resource never changes status, ``/status`` changes only status; a body whose
  resourceVersion differs from the stored one is a 409; a failed JSON-patch ``test`` is a
  422 (kopf relies on both); generation bumps only when something outside metadata and
  status changes; a no-op patch changes nothing;
- DELETE of an object with finalizers sets deletionTimestamp; the object goes away when a
  patch empties its finalizers;
- lists carry ``kind: <Kind>List``, ``apiVersion`` and a resourceVersion; ``Accept:
  ...;as=Table`` answers a ``meta.k8s.io/v1`` Table built from the CRD printer columns, so
  ``kubectl get`` shows them;
- discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/<group>/<version>``) lists the
  built-in resources below and every registered CRD with shortNames and categories;
- custom resources are admitted as an API server admits them: schema defaults applied,
  unknown fields pruned (refused with ``?fieldValidation=Strict``), then the CRD's
  OpenAPI schema and ``x-kubernetes-validations`` (CEL) enforced with
  :mod:`kvpool.api.validation` (a 422 ``Invalid`` naming each field path, as kubectl shows
  it); a write that leaves an already invalid field unchanged passes (ratcheting, so an
  object stored before a CRD upgrade can still get its status and finalizers written).
  :meth:`KubeEmulator.store` writes straight into storage, with no admission, for tests
  of what an operator does with objects a server would have refused;
- deleting an object garbage-collects its dependents (``ownerReferences`` by uid,
  background cascading deletion);
- field selectors: ``=``, ``==`` and ``!=`` on any field path (``kubectl describe`` asks
  for Events by ``involvedObject.*``).

Not emulated (answered with an explicit error, never silently ignored): PUT/replace (405),
server-side apply (415), deletecollection (405). Not emulated at all: orphan/foreground
deletion propagation, admission webhooks, RBAC, namespace existence checks, validation of
built-in kinds.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime
import json
import random
import re
import traceback
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import apps, enums, references, rendering

from kvpool.api.validation import Finding, check_extensions
from kvpool.api.validation.rules import UNEVALUATED
from kvpool.api.validation.schema import apply_defaults, check_value

Obj = dict[str, Any]
TABLE_ACCEPT = "as=Table"
MERGE_PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


@dataclasses.dataclass(frozen=True)
class ApiResource:
    """One served resource (one group/version/plural), as discovery reports it."""

    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()  # e.g. {"status"}
    printer_columns: tuple[Mapping[str, Any], ...] = ()  # CRD additionalPrinterColumns
    schema: Mapping[str, Any] | None = dataclasses.field(  # CRD openAPIV3Schema
        default=None, compare=False, hash=False
    )

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def store_key(self) -> tuple[str, str]:
        """Objects are shared by all versions of a group's resource, as in etcd."""
        return (self.group, self.plural)


def _core(plural: str, kind: str, namespaced: bool = True, **kw: Any) -> ApiResource:
    return ApiResource(
        group="", version="v1", plural=plural, kind=kind, namespaced=namespaced, **kw
    )


STATUS = frozenset({"status"})
BUILTIN_RESOURCES: tuple[ApiResource, ...] = (
    _core("namespaces", "Namespace", False, short_names=("ns",), subresources=STATUS),
    _core("configmaps", "ConfigMap", short_names=("cm",)),
    _core("secrets", "Secret"),
    _core("services", "Service", short_names=("svc",), categories=("all",), subresources=STATUS),
    _core("pods", "Pod", short_names=("po",), categories=("all",), subresources=STATUS),
    _core("events", "Event", short_names=("ev",)),
    ApiResource("apps", "v1", "deployments", "Deployment", True, ("deploy",), ("all",), STATUS),
    ApiResource(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        ("pdb",),
        subresources=STATUS,
    ),
    ApiResource("events.k8s.io", "v1", "events", "Event", True, ("ev",)),
    ApiResource("coordination.k8s.io", "v1", "leases", "Lease", True),
    ApiResource(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ("crd", "crds"),
        subresources=STATUS,
    ),
)
VERBS = ["create", "delete", "get", "list", "patch", "watch"]
CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the API server uses for generateName


def resources_of_crd(crd: Mapping[str, Any]) -> list[ApiResource]:
    """The served resources a CustomResourceDefinition declares (one per served version)."""
    spec, names = crd["spec"], crd["spec"]["names"]
    return [
        ApiResource(
            group=spec["group"],
            version=v["name"],
            plural=names["plural"],
            kind=names["kind"],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames", ())),
            categories=tuple(names.get("categories", ())),
            subresources=frozenset(v.get("subresources", {})),
            printer_columns=tuple(v.get("additionalPrinterColumns", ())),
            schema=(v.get("schema") or {}).get("openAPIV3Schema"),
        )
        for v in spec["versions"]
        if v.get("served", True)
    ]


def kopf_peering_crds() -> list[Obj]:
    """kopf's peering CRDs (kopf.dev/v1 ClusterKopfPeering and KopfPeering, no subresources)."""
    schema = {"openAPIV3Schema": {"type": "object", "properties": {"status": {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}  # fmt: skip
    return [
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "metadata": {"name": f"{kind.lower()}s.kopf.dev"},
         "spec": {"group": "kopf.dev", "scope": scope,
                  "names": {"kind": kind, "plural": f"{kind.lower()}s", "singular": kind.lower()},
                  "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}]}}
        for kind, scope in (("ClusterKopfPeering", "Cluster"), ("KopfPeering", "Namespaced"))
    ]  # fmt: skip


def kube_error(status: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    """A Kubernetes ``Status`` failure (reason is the Kubernetes StatusReason constant)."""
    return kmock.KubernetesError(status=status, reason=reason, message=message, details=details)


# --- pure helpers: selectors, patches, JSONPath ----------------------------------------------


_REQUIREMENT = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<val>[A-Za-z0-9_.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\))?\s*$"
)


def parse_label_selector(text: str) -> list[tuple[str, str, frozenset[str]]]:
    """Requirements (key, op, values) of a labelSelector string; ops: = != in notin exists !.

    >>> parse_label_selector("app=x,!legacy")
    [('app', '=', frozenset({'x'})), ('legacy', '!', frozenset())]
    """
    parts = re.split(r",(?![^()]*\))", text) if text.strip() else []
    reqs = []
    for part in parts:
        m = _REQUIREMENT.match(part)
        if m is None or (m["neg"] and (m["op"] or m["setop"])):
            raise kube_error(400, "BadRequest", f"unable to parse requirement: {part!r}")
        if m["setop"]:
            vals = frozenset(v.strip() for v in m["vals"].split(",") if v.strip())
            reqs.append((m["key"], m["setop"], vals))
        elif m["op"]:
            reqs.append((m["key"], "!=" if m["op"] == "!=" else "=", frozenset({m["val"]})))
        else:
            reqs.append((m["key"], "!" if m["neg"] else "exists", frozenset()))
    return reqs


def labels_match(
    reqs: Iterable[tuple[str, str, frozenset[str]]], labels: Mapping[str, str]
) -> bool:
    """Whether labels satisfy every requirement (as Kubernetes: != and notin match absence)."""
    checks = {
        "=": lambda k, vs: k in labels and labels[k] in vs,
        "in": lambda k, vs: k in labels and labels[k] in vs,
        "!=": lambda k, vs: labels.get(k) not in vs,
        "notin": lambda k, vs: labels.get(k) not in vs,
        "exists": lambda k, vs: k in labels,
        "!": lambda k, vs: k not in labels,
    }
    return all(checks[op](key, vals) for key, op, vals in reqs)


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


_JSONPATH_STEP = re.compile(
    r"\.(?P<field>[A-Za-z0-9_-]+)|\[(?P<index>-?\d+)\]|\[\*\]"
    r"|\[\?\(@\.(?P<fkey>[A-Za-z0-9_.-]+)\s*==\s*[\"'](?P<fval>[^\"']*)[\"']\)\]"
)


def eval_jsonpath(obj: Any, path: str) -> list[Any]:
    """Values at a printer-column JSONPath (the subset CRDs use: fields, [i], [*], [?(@.k=="v")]).

    >>> eval_jsonpath({"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
    ...               '.status.conditions[?(@.type=="Ready")].status')
    ['True']
    """
    nodes, pos, path = [obj], 0, path.strip().removeprefix("{").removesuffix("}").strip()
    while pos < len(path) and nodes:
        m = _JSONPATH_STEP.match(path, pos)
        if m is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {pos}")
        pos = m.end()
        if m["field"] is not None:
            nodes = [n[m["field"]] for n in nodes if isinstance(n, dict) and m["field"] in n]
        elif m["index"] is not None:
            i = int(m["index"])
            nodes = [n[i] for n in nodes if isinstance(n, list) and -len(n) <= i < len(n)]
        elif m["fkey"] is not None:
            nodes = [
                item
                for n in nodes
                if isinstance(n, list)
                for item in n
                if eval_jsonpath(item, "." + m["fkey"]) == [m["fval"]]
            ]
        else:
            nodes = [item for n in nodes if isinstance(n, list) for item in n]
    return nodes


def human_age(timestamp: str, now: datetime.datetime) -> str:
    """How kubectl shows a ``date`` column: the age of an RFC 3339 time, short.

    >>> human_age("2026-01-01T00:00:00Z", datetime.datetime(2026, 1, 1, 2, 5, tzinfo=datetime.UTC))
    '125m'
    """
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int((now - then).total_seconds()))
    minutes, hours = seconds // 60, seconds // 3600
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{hours}h" if hours < 48 else f"{hours // 24}d"


def _without(obj: Obj, *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- admission of custom resources: defaults, pruning, schema and CEL ---------------------------

TOP_LEVEL = ("apiVersion", "kind", "metadata")


def prune(schema: Mapping[str, Any], value: Any, path: str = "") -> tuple[Any, list[str]]:
    """``value`` without the fields its structural schema does not know (as the API server
    prunes them), and the paths removed. ``x-kubernetes-preserve-unknown-fields`` keeps a
    node as it is.

    >>> prune({"type": "object", "properties": {"a": {"type": "integer"}}}, {"a": 1, "b": 2})
    ({'a': 1}, ['b'])
    """
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return value, []
    removed: list[str] = []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not path and key in TOP_LEVEL:  # metadata is the server's, never pruned
                out[key] = item
                continue
            child = props.get(key) if props is not None else None
            if child is None and isinstance(extra, dict):
                child = extra
            if child is None:
                removed.append(where)
                continue
            out[key], gone = prune(child, item, where)
            removed += gone
        return out, removed
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = []
        for index, item in enumerate(value):
            kept, gone = prune(schema["items"], item, f"{path}[{index}]")
            items.append(kept)
            removed += gone
        return items, removed
    return value, removed


_MISSING = object()


def value_at(obj: Any, path: str) -> Any:
    """The value at a finding's path (``spec.tiers[0].floorPercent``), or a marker when
    absent; findings with an empty path name the whole object.

    >>> value_at({"spec": {"tiers": [{"floorPercent": 5}]}}, "spec.tiers[0].floorPercent")
    5
    """
    node: Any = obj
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        if name and isinstance(node, dict) and name in node:
            node = node[name]
        elif index and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        else:
            return _MISSING
    return node


def admission_findings(schema: Mapping[str, Any], obj: Obj) -> list[Finding]:
    """Schema and CEL findings for an already defaulted and pruned object."""
    body = {k: v for k, v in obj.items() if k not in TOP_LEVEL}
    findings = check_value(dict(schema), body)
    rules = check_extensions(dict(schema), body)
    if findings:  # rules over ill-typed data cannot be evaluated; the schema says why
        rules = [f for f in rules if UNEVALUATED not in f.reason]
    return findings + rules


# --- the emulator ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One change in the event log; ``old`` lets a selector-filtered watch see objects leave."""

    rv: int
    store_key: tuple[str, str]
    type: str  # ADDED | MODIFIED | DELETED
    old: Obj | None
    new: Obj


@dataclasses.dataclass(frozen=True)
class Route:
    """A Kubernetes URL taken apart (kmock 0.8 cannot parse ``/api/v1/namespaces[/<name>]``)."""

    group: str
    version: str
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    @classmethod
    def parse(cls, path: str) -> Route | None:
        parts = [p for p in path.strip("/").split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            return None
        plural, name, subresource = [*rest, None, None, None][:3]
        return cls(group, version, plural, namespace, name, subresource)


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with watch resumption, metadata, subresources and more.

    State lives in ``objects_by_key`` ((group, plural), namespace or "", name) -> object and in
    ``events`` (the watch log); kmock's own ``objects``/``resources`` stay empty. Read state
    through HTTP or on the emulator's loop (``KubeApi.call``); ``requests`` is kmock's log.
    """

    api_resources: dict[tuple[str, str, str], ApiResource] = attrs.field(factory=dict, init=False)
    objects_by_key: dict[tuple[tuple[str, str], str, str], Obj] = attrs.field(
        factory=dict, init=False
    )
    events: list[WatchEvent] = attrs.field(factory=list, init=False)
    internal_errors: list[str] = attrs.field(factory=list, init=False)
    resource_version: int = attrs.field(default=1, init=False)
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)  # replaced per change
    _closing: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        # No super(): kmock's fallback reactions are replaced by _serve(), which answers
        # whatever no reaction of the test answered.
        for resource in BUILTIN_RESOURCES:
            self.api_resources[(resource.group, resource.version, resource.plural)] = resource
        for ns in ("default", "kube-system"):
            self._create(self._resource("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    # --- registration and direct access (call these on the emulator's loop) ----------------

    def register_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve a CRD's resources and store the CRD object (as a POST of the CRD would)."""
        for resource in resources_of_crd(crd):
            self.api_resources[(resource.group, resource.version, resource.plural)] = resource
        if (CRD_KEY, "", crd["metadata"]["name"]) not in self.objects_by_key:
            crds = self._resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            self._create(crds, None, copy.deepcopy(dict(crd)))

    def store(self, api_version: str, plural: str, body: Mapping[str, Any]) -> Obj:
        """Write an object straight into storage: no validation, no pruning, no admission.

        This is how an object stored before a CRD upgrade, or by a server that does not
        enforce CEL, reaches an operator (schema defaults are applied, as a server applies
        them when it reads an object from etcd); tests use it to show what the operator does with
        objects the API server would have refused. Creates, or replaces all but identity
        (uid, creationTimestamp, finalizers, deletionTimestamp) and ``status``; the
        generation bumps when anything outside metadata and status changed.
        """
        group, _, version = api_version.rpartition("/")
        resource = self._resource(group, version, plural)
        if resource.schema is not None:  # defaults apply on every read, as from etcd
            body = apply_defaults(dict(resource.schema), dict(body))
        meta = dict(body.get("metadata") or {})
        namespace = (meta.get("namespace") or "default") if resource.namespaced else None
        old = self.objects_by_key.get(self._key(resource, namespace, meta["name"]))
        if old is None:
            return self._create(resource, namespace, copy.deepcopy(dict(body)))
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

    async def close_watches(self) -> None:
        """End every open watch stream (before the server stops, so that it stops at once)."""
        self._closing = True
        self._wake_watches()

    # --- HTTP entry: kmock's __call__ with our own URL parsing --------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body = await raw_request.read()
        request = self._parse_request(raw_request, body)
        self._requests.append(request)
        try:
            try:  # the reactions a test added (fault injection) come first
                return await apps.RawHandler._handle(self, request)
            except NotImplementedError:  # no reaction matched: answer as the API server
                pass
            response = await self._serve(request)
            if isinstance(response, aiohttp.web.StreamResponse):
                return response
            status = 201 if request.method == "POST" else 200
            return aiohttp.web.json_response(response, status=status)
        except Exception as e:
            if not isinstance(e, kmock.KubernetesError):
                self.internal_errors.append("".join(traceback.format_exception(e)))
            return await self._render_error(e)

    def _parse_request(self, raw: aiohttp.web.BaseRequest, body: bytes) -> rendering.Request:
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        route = Route.parse(raw.path)
        method = enums.method(raw.method)
        action = None
        if route is not None and route.plural is not None:
            watch = method == enums.method.GET and raw.query.get("watch") in ("true", "1")
            by_method = {"GET": "FETCH", "PATCH": "UPDATE", "DELETE": "DELETE"}
            if route.name is None:
                by_method = {"GET": "LIST", "POST": "CREATE"}
            guess = "WATCH" if watch else by_method.get(raw.method)
            action = enums.action(guess) if guess else None
        return rendering.Request(
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=dict(raw.query),
            headers=dict(raw.headers),
            cookies=dict(raw.cookies),
            body=body,
            text=body.decode("utf-8", "replace"),
            data=data,
            action=action,
            resource=None
            if route is None
            else references.resource(group=route.group, version=route.version, plural=route.plural),
            namespace=None if route is None else route.namespace,
            name=None if route is None else route.name,
            subresource=None if route is None else route.subresource,
        )

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):
            code, reason, message, details = exc.status, exc.reason, exc.message, exc.details
        else:
            code, reason, message, details = 500, "InternalError", repr(exc), {}
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details or {},
            "code": code,
        }
        return aiohttp.web.json_response(status, status=code)

    # --- dispatch -----------------------------------------------------------------------------

    async def _serve(self, request: rendering.Request) -> Obj | aiohttp.web.StreamResponse:
        path = request.url.path.rstrip("/") or "/"
        route = Route.parse(path)
        if route is None or route.plural is None:
            return self._discovery(path, route)
        resource = self._resource(route.group, route.version, route.plural)
        if resource.namespaced and route.namespace is None and route.name is not None:
            raise kube_error(404, "NotFound", f"{route.plural} is namespaced: use namespaces/<ns>/")
        namespace = route.namespace if resource.namespaced else None
        table = TABLE_ACCEPT in request.headers.get("Accept", "")
        match request.method, route.name:
            case "GET", _ if request.action == enums.action.WATCH:
                events = self._watch(resource, namespace, route.name, request.params)
                return await self._stream(request, events, resource if table else None)
            case "GET", None:
                items = self._list(resource, namespace, request.params)
                return self._table(resource, items) if table else self._list_body(resource, items)
            case "GET", str() as name:
                obj = self._get(resource, namespace, name)
                return self._table(resource, [obj]) if table else obj
            case "POST", None:
                body = self._body(request, dict)
                validation = request.params.get("fieldValidation", "Warn")
                return self._create(resource, namespace, body, validation)
            case "PATCH", str() as name:
                content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
                body = self._body(request, (dict, list))
                validation = request.params.get("fieldValidation", "Warn")
                return self._patch(
                    resource, namespace, name, route.subresource, content_type, body, validation
                )
            case "DELETE", str() as name:
                return self._delete(resource, namespace, name)
            case "PUT", _:
                raise kube_error(405, "MethodNotAllowed", "PUT (replace) is not emulated: patch")
        raise kube_error(405, "MethodNotAllowed", f"{request.method} {path} is not emulated")

    def _resource(self, group: str, version: str, plural: str) -> ApiResource:
        resource = self.api_resources.get((group, version, plural))
        if resource is None:
            raise kube_error(
                404,
                "NotFound",
                f"the server could not find the requested resource "
                f"({group or 'core'}/{version} {plural})",
            )
        return resource

    @staticmethod
    def _body(request: rendering.Request, types: type | tuple[type, ...]) -> Any:
        if not isinstance(request.data, types):
            raise kube_error(400, "BadRequest", "the body is not valid JSON of the expected type")
        return request.data

    def _key(self, resource: ApiResource, namespace: str | None, name: str) -> Any:
        return (resource.store_key, namespace or "", name)

    def _get(self, resource: ApiResource, namespace: str | None, name: str) -> Obj:
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
                self._delete(by_store[store_key], ns or None, name)

    def _wake_watches(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # --- verbs ----------------------------------------------------------------------------------

    def _admit(
        self,
        resource: ApiResource,
        obj: Obj,
        field_validation: str | None,
        old: Obj | None = None,
    ) -> Obj:
        """Default, prune and validate a custom resource as the API server would.

        ``field_validation`` is the request's ``fieldValidation``: ``Strict`` refuses
        unknown fields, ``Warn``/``Ignore`` (and none) prune them; ``None`` from
        :meth:`store` skips admission altogether.
        """
        if resource.schema is None or field_validation == "skip":
            return obj
        defaulted = apply_defaults(dict(resource.schema), obj)
        pruned, unknown = prune(resource.schema, defaulted)
        findings = [Finding(path, "unknown field") for path in unknown]
        if field_validation != "Strict":
            findings = []
        findings += admission_findings(resource.schema, pruned)
        if old is not None:  # ratcheting: what was invalid and is unchanged stays allowed
            before, _ = prune(resource.schema, apply_defaults(dict(resource.schema), old))
            findings = [f for f in findings if value_at(pruned, f.path) != value_at(before, f.path)]
        if findings:
            name = (obj.get("metadata") or {}).get("name", "")
            causes = [
                {"reason": "FieldValueInvalid", "field": f.path, "message": f.reason}
                for f in findings
            ]
            details = "; ".join(f"{f.path}: {f.reason}" for f in findings)
            raise kube_error(
                422,
                "Invalid",
                f'{resource.kind}.{resource.group} "{name}" is invalid: {details}',
                name=name,
                group=resource.group,
                kind=resource.kind,
                causes=causes,
            )
        result: Obj = pruned
        return result

    def _create(
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
        obj = self._admit(resource, obj, field_validation)
        if resource.store_key == CRD_KEY:
            for served in resources_of_crd(obj):
                self.api_resources[(served.group, served.version, served.plural)] = served
        return self._record(resource, "ADDED", None, obj)

    def _patch(
        self,
        resource: ApiResource,
        namespace: str | None,
        name: str,
        subresource: str | None,
        content_type: str,
        patch: Any,
        field_validation: str | None = "skip",
    ) -> Obj:
        old = self._get(resource, namespace, name)
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
        new = self._admit(
            resource, self._isolate(resource, subresource, old, patched), field_validation, old
        )
        if new == old:
            return old
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

    def _delete(self, resource: ApiResource, namespace: str | None, name: str) -> Obj:
        old = self._get(resource, namespace, name)
        if not old["metadata"].get("finalizers"):
            return self._record(resource, "DELETED", old, copy.deepcopy(old))
        if old["metadata"].get("deletionTimestamp"):
            return old
        new = copy.deepcopy(old)
        new["metadata"]["deletionTimestamp"] = _now()
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        return self._record(resource, "MODIFIED", old, new)

    def _selector(self, params: Mapping[str, str]) -> Callable[[Obj], bool]:
        """A predicate on objects from labelSelector and fieldSelector.

        Field selectors: ``=``, ``==`` and ``!=`` on ``metadata.name``,
        ``metadata.namespace`` and any other dotted field path (kubectl describe selects
        Events by ``involvedObject.name``, ``.namespace``, ``.kind`` and ``.uid``).
        """
        reqs = parse_label_selector(params.get("labelSelector", ""))
        fields: list[tuple[list[str], bool, str]] = []
        for term in filter(None, params.get("fieldSelector", "").split(",")):
            match = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)", term.strip())
            if match is None:
                raise kube_error(400, "BadRequest", f"fieldSelector {term!r} is not emulated")
            fields.append((match[1].split("."), match[2] == "!=", match[3]))

        def field(obj: Obj, path: list[str]) -> str:
            node: Any = obj
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            return "" if node is None else str(node)

        def matches(obj: Obj) -> bool:
            meta = obj["metadata"]
            return labels_match(reqs, meta.get("labels") or {}) and all(
                (field(obj, path) == value) != negated for path, negated, value in fields
            )

        return matches

    def _list(
        self, resource: ApiResource, namespace: str | None, params: Mapping[str, str]
    ) -> list[Obj]:
        matches = self._selector(params)
        return [
            obj
            for (store_key, ns, _), obj in sorted(self.objects_by_key.items())
            if store_key == resource.store_key and namespace in (None, ns) and matches(obj)
        ]

    def _list_body(self, resource: ApiResource, items: list[Obj]) -> Obj:
        return {
            "apiVersion": resource.api_version,
            "kind": f"{resource.kind}List",
            "metadata": {"resourceVersion": str(self.resource_version)},
            "items": items,
        }

    def _watch(
        self,
        resource: ApiResource,
        namespace: str | None,
        name: str | None,
        params: Mapping[str, str],
    ) -> AsyncGenerator[Obj, None]:
        """Check the watch parameters now (a 400 is a plain answer), then follow the log."""
        matches = self._selector(params)
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
            initial = [o for o in self._list(resource, namespace, {}) if relevant(o)]
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

        while not self._closing:
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

    async def _stream(
        self,
        request: rendering.Request,
        events: AsyncGenerator[Obj, None],
        table_of: ApiResource | None = None,
    ) -> aiohttp.web.StreamResponse:
        """Write watch events as JSON lines until the watch ends or the client goes away.

        With ``table_of`` (``kubectl get -w``), each object is sent as a one-row Table.
        """
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        assert request._raw_request is not None
        try:
            await response.prepare(request._raw_request)
            async for event in events:
                if table_of is not None and event["type"] != "BOOKMARK":
                    row = self._table(table_of, [event["object"]])
                    await response.write(json.dumps({**event, "object": row}).encode() + b"\n")
                else:
                    await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        except ConnectionError:
            pass  # the watcher went away
        finally:
            await events.aclose()
        return response

    # --- tables and discovery -------------------------------------------------------------------

    def _table(self, resource: ApiResource, items: list[Obj]) -> Obj:
        """A meta.k8s.io/v1 Table (what ``kubectl get`` asks for) from the printer columns."""
        columns = list(resource.printer_columns) or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
        ]
        definitions = [
            {
                "name": "Name",
                "type": "string",
                "format": "name",
                "priority": 0,
                "description": "Name of the object.",
            }
        ] + [
            {
                "name": c["name"],
                "type": c.get("type", "string"),
                "format": c.get("format", ""),
                "description": c.get("description", ""),
                "priority": c.get("priority", 0),
            }
            for c in columns
        ]

        def cell(obj: Obj, column: Mapping[str, Any]) -> Any:
            values = eval_jsonpath(obj, column["jsonPath"])
            if not values:
                return None
            if column.get("type") == "date" and isinstance(values[0], str):
                return human_age(values[0], datetime.datetime.now(datetime.UTC))
            texts = [
                v if isinstance(v, str | int | float) else json.dumps(v, separators=(",", ":"))
                for v in values
            ]
            return texts[0] if len(texts) == 1 else ",".join(map(str, texts))

        rows = [
            {
                "cells": [obj["metadata"]["name"]] + [cell(obj, c) for c in columns],
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj["metadata"],
                },
            }
            for obj in items
        ]
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.resource_version)},
            "columnDefinitions": definitions,
            "rows": rows,
        }

    def _discovery(self, path: str, route: Route | None) -> Obj:
        served = list(self.api_resources.values())
        groups: dict[str, list[str]] = {}
        for r in served:
            if r.group and r.version not in groups.setdefault(r.group, []):
                groups[r.group].append(r.version)

        def group_body(group: str) -> Obj:
            versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups[group]]
            return {"name": group, "versions": versions, "preferredVersion": versions[0]}

        if path == "/version":
            return {
                "major": "1",
                "minor": "32",
                "gitVersion": "v1.32.0-kvpool-emulator",
                "platform": "linux/amd64",
            }
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [group_body(g) for g in sorted(groups)],
            }
        if path.startswith("/apis/") and path.count("/") == 2 and path[6:] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **group_body(path[6:])}
        if route is not None and route.plural is None:
            listed = [r for r in served if (r.group, r.version) == (route.group, route.version)]
            if listed:
                return self._resource_list(route.group, route.version, listed)
        raise kube_error(404, "NotFound", f"the server could not find the resource {path}")

    @staticmethod
    def _resource_list(group: str, version: str, listed: list[ApiResource]) -> Obj:
        entries: list[Obj] = []
        for r in sorted(listed, key=lambda r: r.plural):
            entries.append(
                {
                    "name": r.plural,
                    "singularName": r.kind.lower(),
                    "kind": r.kind,
                    "namespaced": r.namespaced,
                    "verbs": VERBS,
                    "shortNames": list(r.short_names),
                    "categories": list(r.categories),
                }
            )
            entries += [
                {
                    "name": f"{r.plural}/{sub}",
                    "singularName": "",
                    "kind": r.kind,
                    "namespaced": r.namespaced,
                    "verbs": ["get", "patch"],
                }
                for sub in sorted(r.subresources)
            ]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }
