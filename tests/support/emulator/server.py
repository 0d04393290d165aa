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
  ``/openapi/v3`` serves each CRD's schema (:mod:`.openapi`), so ``kubectl explain`` works;
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
- size limits: a ConfigMap or Secret whose data exceeds 1 MiB is a 422 ``Invalid`` ("Too
  long: may not be more than 1048576 bytes", the API server's wording), any object over
  etcd's 1.5 MiB a 413, a request body over 3 MiB a 413;
- field selectors: ``=``, ``==`` and ``!=`` on any field path (``kubectl describe`` asks
  for Events by ``involvedObject.*``).

Not emulated (answered with an explicit error, never silently ignored): PUT/replace (405),
server-side apply (415), deletecollection (405). Not emulated at all: orphan/foreground
deletion propagation, admission webhooks, RBAC, namespace existence checks, validation of
built-in kinds.

The parts: :mod:`.resources` (what is served, discovery), :mod:`.store` (objects, the
resourceVersion counter, the event log, watches), :mod:`.admission` (defaults, pruning,
schema and CEL), :mod:`.openapi` (``/openapi/v3``), :mod:`.selectors` (label and field
selectors), :mod:`.tables` (``kubectl get`` Tables); this module is the HTTP layer on kmock.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import apps, enums, references, rendering

from tests.support.emulator.openapi import PREFIX as OPENAPI_PREFIX
from tests.support.emulator.openapi import openapi_v3
from tests.support.emulator.resources import ApiResource, Obj, Route, discovery, kube_error
from tests.support.emulator.store import ObjectStore
from tests.support.emulator.tables import TABLE_ACCEPT, build_table


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator with watch resumption, metadata, subresources and more.

    State lives in ``state`` (:class:`~.store.ObjectStore`); kmock's own
    ``objects``/``resources`` stay empty. Read state through HTTP or on the emulator's loop
    (``KubeApi.call``); ``requests`` is kmock's log.
    """

    state: ObjectStore = attrs.field(factory=ObjectStore, init=False)
    internal_errors: list[str] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        # No super(): kmock's fallback reactions are replaced by _serve(), which answers
        # whatever no reaction of the test answered.
        pass

    # --- registration and direct access (call these on the emulator's loop) ----------------

    def register_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve a CRD's resources and store the CRD object (as a POST of the CRD would)."""
        self.state.register_crd(crd)

    def store(self, api_version: str, plural: str, body: Mapping[str, Any]) -> Obj:
        """Write an object straight into storage, with no admission
        (:meth:`~.store.ObjectStore.put`)."""
        return self.state.put(api_version, plural, body)

    async def close_watches(self) -> None:
        """End every open watch stream (before the server stops, so that it stops at once)."""
        self.state.close_watches()

    # --- HTTP entry: kmock's __call__ with our own URL parsing --------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        try:
            body = await raw_request.read()
        except aiohttp.web.HTTPRequestEntityTooLarge as e:  # as a real API server words it
            return await self._render_error(
                kube_error(413, "RequestEntityTooLarge", f"Request entity too large: {e.text}")
            )
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
        if path == OPENAPI_PREFIX or path.startswith(OPENAPI_PREFIX + "/"):
            return openapi_v3(path, list(self.state.api_resources.values()))
        route = Route.parse(path)
        if route is None or route.plural is None:
            return discovery(path, route, list(self.state.api_resources.values()))
        resource = self.state.resource(route.group, route.version, route.plural)
        if resource.namespaced and route.namespace is None and route.name is not None:
            raise kube_error(404, "NotFound", f"{route.plural} is namespaced: use namespaces/<ns>/")
        namespace = route.namespace if resource.namespaced else None
        table = TABLE_ACCEPT in request.headers.get("Accept", "")
        match request.method, route.name:
            case "GET", _ if request.action == enums.action.WATCH:
                events = self.state.watch(resource, namespace, route.name, request.params)
                return await self._stream(request, events, resource if table else None)
            case "GET", None:
                items = self.state.list_objects(resource, namespace, request.params)
                return (
                    self._table(resource, items) if table else self.state.list_body(resource, items)
                )
            case "GET", str() as name:
                obj = self.state.get(resource, namespace, name)
                return self._table(resource, [obj]) if table else obj
            case "POST", None:
                body = self._body(request, dict)
                validation = request.params.get("fieldValidation", "Warn")
                return self.state.create(resource, namespace, body, validation)
            case "PATCH", str() as name:
                content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
                body = self._body(request, (dict, list))
                validation = request.params.get("fieldValidation", "Warn")
                return self.state.patch(
                    resource, namespace, name, route.subresource, content_type, body, validation
                )
            case "DELETE", str() as name:
                return self.state.delete(resource, namespace, name)
            case "PUT", _:
                raise kube_error(405, "MethodNotAllowed", "PUT (replace) is not emulated: patch")
        raise kube_error(405, "MethodNotAllowed", f"{request.method} {path} is not emulated")

    @staticmethod
    def _body(request: rendering.Request, types: type | tuple[type, ...]) -> Any:
        if not isinstance(request.data, types):
            raise kube_error(400, "BadRequest", "the body is not valid JSON of the expected type")
        return request.data

    def _table(self, resource: ApiResource, items: list[Obj]) -> Obj:
        return build_table(resource, items, self.state.resource_version)

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
