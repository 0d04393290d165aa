"""The REST resources the operator reads and writes, and their URL paths.

Why it exists: every call names its resource by one :class:`Resource` constant instead of
building paths by hand; the kvpool kinds take their group and version from the API
package (:mod:`kvpool.api.common`), their one definition.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.api.common import GROUP, VERSION


@dataclass(frozen=True)
class Resource:
    """A REST resource: API group ('' for core), version and plural."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        """The URL path of the collection, or of one object (and a subresource).

        >>> MODELPOOLS.path("ns", "chat", "status")
        '/apis/kvpool.dev/v1alpha1/namespaces/ns/modelpools/chat/status'
        >>> PODS.path()
        '/api/v1/pods'
        """
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


MODELPOOLS = Resource(GROUP, VERSION, "modelpools")
TIERPOLICIES = Resource(GROUP, VERSION, "tierpolicies")
TENANTBUDGETS = Resource(GROUP, VERSION, "tenantbudgets")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
SERVICES = Resource("", "v1", "services")
PODS = Resource("", "v1", "pods")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
PDBS = Resource("policy", "v1", "poddisruptionbudgets")
LEASES = Resource("coordination.k8s.io", "v1", "leases")
CHILD_RESOURCES = (DEPLOYMENTS, SERVICES, PDBS)
