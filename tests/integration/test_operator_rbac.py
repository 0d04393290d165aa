"""The chart grants the operator exactly what its code uses: no verb or resource more.

The used set is derived, not maintained: a real operator process (kopf plus our adapter)
runs a scenario touching every path - a pool planned, scaled, given ready pods and a
ready Deployment, then deleted with its children; a policy's in-use finalizer held and
released; a tenant whose key resolves; an invalid object reported with an Event; the
leader Lease - and the emulator records every request it made (told apart from the test's
own requests by User-Agent). The rendered chart's rules for the operator's service
account must equal that set (scope included: namespaced rules in a Role of the watched
namespace or a ClusterRole, cluster-scoped resources only in a ClusterRole, the Lease in
the release namespace), apart from the documented exceptions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.builders import tenantbudget_manifest
from tests.integration.test_operator import (
    condition,
    core,
    given_policy_tenant_and_pool,
    mp,
    status,
    tb,
    tp,
)
from tests.operator_process import OperatorProcess
from tests.support.kube import KubeApi
from tests.support.waiting import wait_until

CHART = Path(__file__).resolve().parents[2] / "charts" / "kvpool"
RELEASE_NS = "kvpool-system"
# Granted but not an API call: OpenShift's OwnerReferencesPermissionEnforcement checks it
# when the operator sets blockOwnerDeletion on a child's ownerReference.
# Deleting a ConfigMap happens only when a sharded config drops a tenant shard (a
# namespace with thousands of tenants: tests/integration/test_config_shards.py).
EXCEPTIONS = {("kvpool.dev", "modelpools/finalizers", "update"), ("", "configmaps", "delete")}
CLUSTER_SCOPED = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}
Grant = tuple[str, str, str, str]  # (apiGroup, resource[/subresource], verb, scope)


def verb(method: str, named: bool, watch: bool) -> str:
    if method == "GET":
        return "get" if named else ("watch" if watch else "list")
    return {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}[method]


def used_by_operator(kube: KubeApi, namespaced: bool) -> set[Grant]:
    """What the operator process asked the API server for, as RBAC grants."""
    used: set[Grant] = set()
    for r in kube.call(lambda e: list(e._requests)):
        agent = r.headers.get("User-Agent", "")
        if r.resource is None or r.resource.plural is None:
            continue  # discovery (/api, /apis...): open to every authenticated client
        if not agent.startswith(("kvpool-operator", "kopf/")):
            continue
        resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
        group = r.resource.group
        if (group, resource) in CLUSTER_SCOPED:
            scope = "cluster"
        elif resource == "leases":
            scope = RELEASE_NS  # the Lease lives in the operator's own namespace
        else:
            scope = "watched" if namespaced else "cluster"
        watch = r.params.get("watch") in ("true", "1")
        used.add((group, resource, verb(str(r.method.value), bool(r.name), watch), scope))
        collection_read = str(r.method.value) == "GET" and not r.name
        if resource in ("secrets", "pods") or (resource == "deployments" and collection_read):
            # never all Secrets, Pods or Deployments: label-selected by the API server
            terms = (r.params.get("labelSelector") or "").split(",")
            keys = {term.split("=")[0] for term in terms}
            assert keys & {"kvpool.dev/api-key", "kvpool.dev/pool"}, (resource, r.params)
    return used


def granted_by_chart(values: dict[str, Any], watched: str | None) -> set[Grant]:
    rendered = helm_python.Chart.load(CHART).render(values, name="kvpool", namespace=RELEASE_NS)
    docs = [
        d
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for d in yaml.safe_load_all(text)
        if d
    ]
    subjects = {
        (b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in docs
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s["name"] == "kvpool-operator" for s in b["subjects"])
    }
    granted: set[Grant] = set()
    for doc in docs:
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        namespace = doc["metadata"].get("namespace")
        if (doc["kind"], doc["metadata"]["name"], namespace) not in subjects:
            continue
        if doc["kind"] == "ClusterRole":
            scope = "cluster"
        else:
            scope = "watched" if namespace == watched else namespace
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    if doc["kind"] == "Role":
                        assert (group, resource) not in CLUSTER_SCOPED, f"{resource} in a Role"
                    for v in rule["verbs"]:
                        granted.add((group, resource, v, scope))
    return granted


def run_scenario(kube: KubeApi) -> None:
    given_policy_tenant_and_pool(kube)
    wait_until(lambda: status(kube).get("plan"))
    wait_until(lambda: "kvpool.dev/in-use" in kube.client.get(tp("tiers"))["metadata"].get(
        "finalizers", []))  # fmt: skip
    wait_until(lambda: condition(kube.client.get(tb("acme"))["status"], "KeyResolved")[0])
    kube.client.patch(mp("chat"), {"spec": {"capacity": {"peakConcurrency": {"interactive": 12}}}})
    wait_until(lambda: status(kube)["plan"]["replicas"] == 4)
    # a new port and floor rewrite the Service and the PDB (JSON patch of their spec)
    kube.client.patch(mp("chat"), {"spec": {"engine": {"port": 8001}, "capacity": {
        "minReplicas": 2}}})  # fmt: skip
    wait_until(lambda: kube.client.get(core("poddisruptionbudgets", "chat", api="policy/v1"))[
        "spec"]["minAvailable"] == 2)  # fmt: skip
    pod = {"metadata": {"name": "chat-stable-a", "labels": {"kvpool.dev/pool": "chat"}},
           "spec": {"containers": [{"name": "engine", "image": "x"}]}}  # fmt: skip
    kube.client.create(core("pods"), pod)
    kube.client.patch(core("pods", "chat-stable-a") + "/status", {"status": {"podIP": "10.0.0.9"}})
    kube.client.patch(
        core("deployments", "chat-stable", api="apps/v1") + "/status",
        {"status": {"replicas": 4, "readyReplicas": 4}},
    )
    wait_until(lambda: status(kube)["replicas"]["ready"] == 4)
    kube.client.create(tb(), tenantbudget_manifest("bad").tiers("gold").dict())
    wait_until(lambda: (kube.client.get(tb("bad")).get("status") or {}).get("conditions"))
    kube.client.delete(mp("chat"))
    wait_until(lambda: kube.client.request("GET", mp("chat")).status == 404)
    wait_until(lambda: not kube.client.get(tp("tiers"))["metadata"].get("finalizers"))


@pytest.mark.parametrize(
    ("values", "watched"),
    [
        ({}, None),
        (
            {"operator": {"watchNamespace": "default"}, "gateway": {"poolNamespace": "default"}},
            "default",
        ),
    ],
    ids=["cluster-wide", "namespaced"],
)
def test_the_chart_grants_exactly_what_the_operator_uses(
    kube_api: KubeApi, tmp_path: Path, values: dict[str, Any], watched: str | None
) -> None:
    args = ("--namespace=default",) if watched else ()
    op = OperatorProcess(kube_api, tmp_path, extra_args=args, allow_static_endpoints=False)
    try:
        op.start()
        run_scenario(kube_api)
    finally:
        op.stop()

    used = used_by_operator(kube_api, namespaced=watched is not None)
    granted = granted_by_chart(values, watched)
    exceptions = {(*e, "watched" if watched else "cluster") for e in EXCEPTIONS}
    assert sorted(used - granted) == [], "the operator uses what the chart does not grant"
    assert sorted(granted - used - exceptions) == [], "the chart grants what is never used"
