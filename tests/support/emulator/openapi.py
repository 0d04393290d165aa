"""The emulator's ``/openapi/v3``: what ``kubectl explain`` reads to describe a resource.

Why it exists: ``kubectl explain modelpools.spec`` asks the server for its OpenAPI v3
discovery document, then for the document of the resource's group version, and looks the
kind up by its ``x-kubernetes-group-version-kind`` extension; with neither served it
answers NotFound. An API server builds these documents from each CRD's
``openAPIV3Schema``; so does this module, for every served resource that has one (the
custom resources). Built-in kinds have no schema here and are not listed.

- ``GET /openapi/v3`` -> ``{"paths": {"apis/<group>/<version>": {"serverRelativeURL":
  "/openapi/v3/apis/<group>/<version>?hash=<digest>"}}}``;
- ``GET /openapi/v3/apis/<group>/<version>`` -> an OpenAPI 3.0 document whose ``paths``
  give each resource's read path with its ``x-kubernetes-group-version-kind`` (kubectl
  maps the resource to its kind through them) and whose ``components.schemas`` holds
  ``<reversed group>.<version>.<Kind>`` (e.g. ``dev.kvpool.v1alpha1.ModelPool``) with the
  CRD's schema, ``apiVersion``/``kind``/``metadata`` described as the API server adds them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from tests.support.emulator.resources import ApiResource, Obj, kube_error

PREFIX = "/openapi/v3"

_STANDARD_FIELDS: dict[str, Obj] = {
    "apiVersion": {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation of an "
        "object.",
    },
    "kind": {
        "type": "string",
        "description": "Kind is a string value representing the REST resource this object "
        "represents.",
    },
    "metadata": {
        "type": "object",
        "description": "Standard object's metadata.",
    },
}


def _schema_name(resource: ApiResource) -> str:
    group = ".".join(reversed(resource.group.split(".")))
    return f"{group}.{resource.version}.{resource.kind}"


def _paths(r: ApiResource) -> dict[str, Obj]:
    """The object's read path with its GVK (how kubectl explain maps a resource to a kind)."""
    scope = "namespaces/{namespace}/" if r.namespaced else ""
    base = f"/apis/{r.group}/{r.version}/{scope}{r.plural}"
    gvk = {"group": r.group, "version": r.version, "kind": r.kind}
    ref = {"$ref": f"#/components/schemas/{_schema_name(r)}"}
    get = {
        "description": f"read the specified {r.kind}",
        "operationId": f"read{r.kind}",
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": ref}}}
        },
        "x-kubernetes-action": "get",
        "x-kubernetes-group-version-kind": gvk,
    }
    return {f"{base}/{{name}}": {"get": get}}


def _group_versions(served: list[ApiResource]) -> dict[str, list[ApiResource]]:
    by_gv: dict[str, list[ApiResource]] = {}
    for r in served:
        if r.schema is not None and r.group:
            by_gv.setdefault(f"apis/{r.group}/{r.version}", []).append(r)
    return by_gv


def group_version_document(resources: list[ApiResource]) -> Obj:
    """The OpenAPI 3.0 document of one group version's custom resources."""
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for r in sorted(resources, key=lambda r: r.kind):
        schema = copy.deepcopy(dict(r.schema or {}))
        properties = schema.setdefault("properties", {})
        for field, standard in _STANDARD_FIELDS.items():
            merged = {**standard, **properties.get(field, {})}
            properties[field] = merged
        schema["x-kubernetes-group-version-kind"] = [
            {"group": r.group, "kind": r.kind, "version": r.version}
        ]
        schemas[_schema_name(r)] = schema
        paths.update(_paths(r))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _digest(doc: Obj) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()


def openapi_v3(path: str, served: list[ApiResource]) -> Obj:
    """Answer ``GET /openapi/v3[/<api path>]`` (404 for a group version with no schema)."""
    by_gv = _group_versions(served)
    rest = path[len(PREFIX) :].strip("/")
    if not rest:
        return {
            "paths": {
                gv: {
                    "serverRelativeURL": f"{PREFIX}/{gv}?hash={_digest(group_version_document(rs))}"
                }
                for gv, rs in sorted(by_gv.items())
            }
        }
    if rest in by_gv:
        return group_version_document(by_gv[rest])
    raise kube_error(404, "NotFound", f"the server could not find the requested resource {path}")
