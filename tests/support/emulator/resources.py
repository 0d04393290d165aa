"""What the emulated API server serves: its resources, their URLs, discovery and errors.

Why it exists: every other part of the emulator names a resource by :class:`ApiResource`
(built-in ones below, custom ones from a CRD), takes URLs apart with :class:`Route` and
fails with :func:`kube_error`, a Kubernetes ``Status`` answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import kmock

Obj = dict[str, Any]


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


def discovery(path: str, route: Route | None, served: list[ApiResource]) -> Obj:
    """The discovery documents (``/version``, ``/api``, ``/apis``, a group, a group version)."""
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
            return resource_list(route.group, route.version, listed)
    raise kube_error(404, "NotFound", f"the server could not find the resource {path}")


def resource_list(group: str, version: str, listed: list[ApiResource]) -> Obj:
    """The APIResourceList of one group version (kubectl's shortNames and categories)."""
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
