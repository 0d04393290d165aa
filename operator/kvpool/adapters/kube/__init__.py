"""Kubernetes API I/O: the connection, a REST client with retries, typed errors, Events,
the leader Lease and label-selected watches - one module each.

Why it exists: the reconcile must stay a short orchestration of pure decisions, so every
API call lives here behind a small async client (:mod:`.client`). What to write to an
owned child (the spec-hash and drift policy) is a controller decision and lives in
:mod:`kvpool.controller.apply`; this package only carries the calls out. Callers use the
package as one namespace (``from kvpool.adapters import kube``; ``kube.KubeClient``,
``kube.ConflictError``, ``kube.DEPLOYMENTS``).
"""

from kvpool.adapters.kube.client import (
    JSON_PATCH,
    MERGE_PATCH,
    RETRY_STATUSES,
    USER_AGENT,
    JsonObject,
    KubeClient,
)
from kvpool.adapters.kube.connection import SA_TOKEN, KubeConnection, load_connection
from kvpool.adapters.kube.errors import ApiError, ConflictError, NotFoundError, api_error
from kvpool.adapters.kube.events import create_event
from kvpool.adapters.kube.lease import build_lease_spec, lease_record, write_lease
from kvpool.adapters.kube.resources import (
    CHILD_RESOURCES,
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    LEASES,
    MODELPOOLS,
    PDBS,
    PODS,
    SECRETS,
    SERVICES,
    TENANTBUDGETS,
    TIERPOLICIES,
    Resource,
)
from kvpool.adapters.kube.watch import LabelWatch, ListHandler, WatchExpiredError, WatchHandler
from kvpool.adapters.kube.writes import apply_status, delete_children, set_finalizers

__all__ = [
    "CHILD_RESOURCES",
    "CONFIGMAPS",
    "DEPLOYMENTS",
    "EVENTS",
    "JSON_PATCH",
    "LEASES",
    "MERGE_PATCH",
    "MODELPOOLS",
    "PDBS",
    "PODS",
    "RETRY_STATUSES",
    "SA_TOKEN",
    "SECRETS",
    "SERVICES",
    "TENANTBUDGETS",
    "TIERPOLICIES",
    "USER_AGENT",
    "ApiError",
    "ConflictError",
    "JsonObject",
    "KubeClient",
    "KubeConnection",
    "LabelWatch",
    "ListHandler",
    "NotFoundError",
    "Resource",
    "WatchExpiredError",
    "WatchHandler",
    "api_error",
    "apply_status",
    "build_lease_spec",
    "create_event",
    "delete_children",
    "lease_record",
    "load_connection",
    "set_finalizers",
    "write_lease",
]
