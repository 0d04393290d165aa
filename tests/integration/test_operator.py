"""The real operator process (kopf) against the Kubernetes API emulator, CRDs from crds/.

Given/When/Then per test; every test starts its own API server and operator process
(``run_operator``), which is stopped at teardown. The operator runs without Prometheus
here (declared capacity); measuring is tested with real engines in
tests/integration/test_operator_real_parts.py.

Numbers used throughout (see docs/0001): declared 3,000 KV tokens per replica, target 90%
-> 2,700 usable; p95 200 + 100 = 300 tokens a sequence -> 9 live sequences per replica;
interactive floor 50% with a peak of 6 and 20% headroom -> ceil(6 * 1.2 / 4.5) = 2 replicas.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import kmock

from tests.builders import (
    apikey_secret_manifest,
    declared_modelpool_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
)
from tests.operator_process import OperatorProcess, run_operator
from tests.support.kube import KubeApi, resource_path
from tests.support.waiting import wait_until

NS = "default"
API_KEY = "sk-acme-123"


def mp(name: str | None = None, sub: str | None = None) -> str:
    return resource_path("kvpool.dev/v1alpha1", "modelpools", NS, name, sub)


def tp(name: str | None = None) -> str:
    return resource_path("kvpool.dev/v1alpha1", "tierpolicies", NS, name)


def tb(name: str | None = None) -> str:
    return resource_path("kvpool.dev/v1alpha1", "tenantbudgets", NS, name)


def core(plural: str, name: str | None = None, api: str = "v1") -> str:
    return resource_path(api, plural, NS, name)


DEPLOYMENTS = ("apps/v1", "deployments")
PDBS = ("policy/v1", "poddisruptionbudgets")


def names(kube: KubeApi, plural: str, api: str = "v1") -> list[str]:
    return sorted(i["metadata"]["name"] for i in kube.client.get(core(plural, api=api))["items"])


def pool_builder(name: str = "chat", peak: int = 6) -> Any:
    return declared_modelpool_manifest(name, peak)


def status(kube: KubeApi, name: str = "chat") -> dict[str, Any]:
    return kube.client.get(mp(name)).get("status") or {}


def condition(st: dict[str, Any], type_: str) -> tuple[str, str]:
    found = next(c for c in st.get("conditions", []) if c["type"] == type_)
    return found["status"], found["reason"]


def admission_config(kube: KubeApi) -> dict[str, Any]:
    cm = kube.client.get(core("configmaps", "kvpool-admission"))
    return json.loads(cm["data"]["config.json"])  # type: ignore[no-any-return]


def events(kube: KubeApi, name: str = "chat") -> list[str]:
    items = kube.client.get(core("events"))["items"]
    return [e["reason"] for e in items if e["involvedObject"]["name"] == name]


def given_policy_tenant_and_pool(kube: KubeApi, peak: int = 6) -> None:
    kube.client.create(core("secrets"), apikey_secret_manifest("acme-key", "api-key", API_KEY))
    kube.client.create(
        tb(), tenantbudget_manifest("acme").tiers("interactive", "batch").limit("1h", 10_000).dict()
    )
    kube.client.create(tp(), standard_tierpolicy_manifest().dict())
    kube.client.create(mp(), pool_builder(peak=peak).dict())


def test_a_pool_gets_its_engine_workload_status_and_compiled_config(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    # Given a policy, a tenant with its Secret, and a pool
    given_policy_tenant_and_pool(kube_api)

    # Then the operator creates the Deployment, Service and PDB of the stable track
    st = wait_until(lambda: status(kube_api).get("plan") and status(kube_api))
    dep = wait_until(lambda: kube_api.client.get(core("deployments", "chat-stable", api="apps/v1")))
    assert dep["spec"]["replicas"] == 2 == st["plan"]["replicas"]
    template = dep["spec"]["template"]
    assert template["metadata"]["labels"]["kvpool.dev/revision"] == st["revision"]
    assert template["metadata"]["labels"]["kvpool.dev/track"] == "stable"
    args = template["spec"]["containers"][0]["args"]
    assert "--served-model-name=chat" in args and "--scheduling-policy=priority" in args
    assert (
        dep["metadata"]["ownerReferences"][0]["uid"]
        == kube_api.client.get(mp("chat"))["metadata"]["uid"]
    )
    svc = kube_api.client.get(core("services", "chat-stable"))
    assert svc["spec"]["selector"] == {"kvpool.dev/pool": "chat", "kvpool.dev/track": "stable"}
    assert (
        kube_api.client.get(core("poddisruptionbudgets", "chat", api="policy/v1"))["spec"][
            "minAvailable"
        ]
        == 1
    )

    # And the status says what was planned, from which figure, and why it is not ready
    assert st["observedGeneration"] == 1
    assert st["capacity"] == {
        "kvTokensPerReplica": 3000,
        "source": "Declared",
        "replicasMeasured": 0,
    }
    assert (
        st["plan"]["usableKvTokensPerReplica"],
        st["plan"]["liveSequencesPerReplica"],
        st["plan"]["slotsPerReplica"],
    ) == (2700, 9, 256)
    assert st["plan"]["tiers"][0] == {
        "name": "interactive",
        "floorTokens": 2700,
        "floorSlots": 256,
        "lendableTokens": 2700,
        "lendableSlots": 256,
        "requiredReplicas": 2,
        "capacityShort": False,
    }
    assert condition(st, "Ready") == ("False", "ReplicasNotReady")
    assert condition(st, "CapacityMeasured") == ("False", "DeclaredCapacity")
    assert condition(st, "MetricsUnavailable") == ("True", "MetricsDisabled")
    assert condition(st, "CapacityShort") == ("False", "CapacitySufficient")
    assert st["phase"] == "Pending"

    # And the compiled config holds the plan and the tenant's key digest, never the key
    config = wait_until(lambda: admission_config(kube_api)["pools"] and admission_config(kube_api))
    assert config["formatVersion"] == 1 and config["namespace"] == NS
    pool = config["pools"][0]
    assert (pool["name"], pool["replicas"], pool["totalTokens"], pool["totalSlots"]) == (
        "chat",
        2,
        5400,
        512,
    )
    assert pool["tiers"]["interactive"]["floorTokens"] == 2700
    assert config["tenants"][0]["keySha256"] == hashlib.sha256(API_KEY.encode()).hexdigest()
    assert API_KEY not in json.dumps(config)
    assert [t["name"] for t in config["tierPolicies"][0]["tiers"]] == [
        "interactive",
        "batch",
        "eval",
    ]

    # And a human sees the decision as an Event
    assert "ScaledWarmReplicas" in wait_until(lambda: events(kube_api))

    # And the policy says who uses it, the tenant that its key resolved
    policy = wait_until(lambda: kube_api.client.get(tp("tiers")).get("status"))
    assert policy["pools"] == 1 and condition(policy, "Ready") == ("True", "PolicyReady")
    tenant = wait_until(lambda: kube_api.client.get(tb("acme")).get("status"))
    assert condition(tenant, "KeyResolved") == ("True", "SecretKeyFound")


def test_readiness_and_spec_changes_replan(kube_api: KubeApi, operator: OperatorProcess) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: kube_api.client.get(core("deployments", "chat-stable", api="apps/v1")))
    first_revision = wait_until(lambda: status(kube_api)["revision"])

    # When the engines become ready
    kube_api.client.patch(
        core("deployments", "chat-stable", api="apps/v1") + "/status",
        {"status": {"replicas": 2, "readyReplicas": 2}},
    )
    # Then the pool is Ready
    wait_until(lambda: condition(status(kube_api), "Ready") == ("True", "PoolReady"))
    assert status(kube_api)["replicas"]["ready"] == 2 and status(kube_api)["phase"] == "Ready"

    # When the peak doubles: more warm replicas (ceil(12 * 1.2 / 4.5) = 4)
    kube_api.client.patch(
        mp("chat"), {"spec": {"capacity": {"peakConcurrency": {"interactive": 12}}}}
    )
    wait_until(
        lambda: (
            kube_api.client.get(core("deployments", "chat-stable", api="apps/v1"))["spec"][
                "replicas"
            ]
            == 4
        )
    )
    wait_until(lambda: status(kube_api)["observedGeneration"] == 2)
    assert status(kube_api)["revision"] == first_revision  # planning fields are not the engine

    # When the engine image changes: a canary of the new revision, stable left as it is
    kube_api.client.patch(mp("chat"), {"spec": {"engine": {"image": "vllm/vllm-openai:v0.12.0"}}})
    wait_until(lambda: status(kube_api)["revision"] != first_revision)
    canary = wait_until(
        lambda: kube_api.client.get(core("deployments", "chat-canary", api="apps/v1"))
    )
    assert canary["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "vllm/vllm-openai:v0.12.0"
    )
    assert (
        canary["spec"]["template"]["metadata"]["labels"]["kvpool.dev/revision"]
        == (status(kube_api)["revision"])
    )
    assert canary["spec"]["template"]["metadata"]["labels"]["kvpool.dev/track"] == "canary"
    stable = kube_api.client.get(core("deployments", "chat-stable", api="apps/v1"))
    assert stable["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "vllm/vllm-openai:v0.11.0"
    )
    assert stable["spec"]["replicas"] == 4
    rollout = status(kube_api)["rollout"]
    assert (rollout["phase"], rollout["stage"], rollout["weight"]) == (
        "Progressing",
        "Starting",
        0,
    )
    assert rollout["stableRevision"] == first_revision
    assert names(kube_api, "deployments", "apps/v1") == ["chat-canary", "chat-stable"]


def test_a_tier_policy_change_replans_its_pools_and_the_config(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: status(kube_api)["plan"]["replicas"] == 2)

    # When the interactive floor halves, its peak needs ceil(6 * 1.2 / (9 * 25%)) = 4 replicas
    ops = [{"op": "replace", "path": "/spec/tiers/0/floorPercent", "value": 25}]
    kube_api.client.json_patch(tp("tiers"), ops)

    wait_until(lambda: status(kube_api)["plan"]["replicas"] == 4)
    assert status(kube_api)["plan"]["tiers"][0]["floorTokens"] == 4 * 2700 * 25 // 100
    wait_until(
        lambda: admission_config(kube_api)["tierPolicies"][0]["tiers"][0]["floorPercent"] == 25
    )
    assert admission_config(kube_api)["pools"][0]["replicas"] == 4


def test_tenant_and_secret_changes_update_the_config(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    given_policy_tenant_and_pool(kube_api)
    digest = lambda key: hashlib.sha256(key.encode()).hexdigest()  # noqa: E731
    wait_until(
        lambda: [t["keySha256"] for t in admission_config(kube_api)["tenants"]] == [digest(API_KEY)]
    )

    # When the key rotates, the digest follows
    kube_api.client.patch(
        core("secrets", "acme-key"),
        {"data": apikey_secret_manifest("x", "api-key", "sk-new")["data"]},
    )
    wait_until(lambda: admission_config(kube_api)["tenants"][0]["keySha256"] == digest("sk-new"))

    # When a tenant is added without its Secret, it is left out until the Secret appears
    kube_api.client.create(tb(), tenantbudget_manifest("beta").tiers("batch").dict())
    kube_api.client.patch(tb("acme"), {"spec": {"weight": 5}})
    wait_until(lambda: admission_config(kube_api)["tenants"][0]["weight"] == 5)
    assert [t["tenant"] for t in admission_config(kube_api)["tenants"]] == ["acme"]
    kube_api.client.create(
        core("secrets"), apikey_secret_manifest("beta-key", "api-key", "sk-beta")
    )
    wait_until(
        lambda: [t["tenant"] for t in admission_config(kube_api)["tenants"]] == ["acme", "beta"]
    )

    # When a tenant is deleted, it leaves the config
    kube_api.client.delete(tb("acme"))
    wait_until(lambda: [t["tenant"] for t in admission_config(kube_api)["tenants"]] == ["beta"])


def test_only_labelled_secrets_are_read(kube_api: KubeApi, operator: OperatorProcess) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: admission_config(kube_api)["tenants"])

    # When a tenant's key sits in a Secret without the kvpool.dev/api-key label
    secret = apikey_secret_manifest("beta-key", "api-key", "sk-beta")
    del secret["metadata"]["labels"]
    kube_api.client.create(core("secrets"), secret)
    kube_api.client.create(tb(), tenantbudget_manifest("beta").tiers("batch").dict())

    # Then the operator does not read it: the tenant is left out, and told why
    st = wait_until(lambda: kube_api.client.get(tb("beta")).get("status"))
    assert condition(st, "KeyResolved") == ("False", "SecretKeyNotFound")
    assert "kvpool.dev/api-key" in st["conditions"][0]["message"]
    assert [t["tenant"] for t in admission_config(kube_api)["tenants"]] == ["acme"]

    # When the Secret is labelled, the tenant is served
    kube_api.client.patch(
        core("secrets", "beta-key"), {"metadata": {"labels": {"kvpool.dev/api-key": "true"}}}
    )
    wait_until(
        lambda: [t["tenant"] for t in admission_config(kube_api)["tenants"]] == ["acme", "beta"]
    )


def test_only_kvpool_deployments_are_watched(kube_api: KubeApi, operator: OperatorProcess) -> None:
    """The API server selects the engine Deployments: one without kvpool's labels (a web
    app's, or one carrying only ``kvpool.dev/pool``) never reaches the operator."""
    engine = {"containers": [{"name": "web", "image": "nginx"}]}
    for name, labels in [("web", {"app": "web"}), ("lookalike", {"kvpool.dev/pool": "chat"})]:
        kube_api.client.create(
            core("deployments", api="apps/v1"),
            {"metadata": {"name": name, "labels": labels},
             "spec": {"selector": {"matchLabels": labels}, "template": {
                 "metadata": {"labels": labels}, "spec": engine}}},
        )  # fmt: skip
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: names(kube_api, "deployments", api="apps/v1") == [
        "chat-stable", "lookalike", "web"])  # fmt: skip

    def deployment_reads() -> list[Any]:
        """The operator's list and watch requests of Deployments (named reads aside)."""
        return [
            r
            for r in kube_api.call(lambda e: list(e._requests))
            if r.headers.get("User-Agent", "").startswith(("kvpool-operator", "kopf/"))
            and r.resource is not None
            and r.resource.plural == "deployments"
            and str(r.method.value) == "GET"
            and not r.name
        ]

    reads = wait_until(lambda: [r for r in deployment_reads() if r.params.get("watch")])
    for request in [*deployment_reads(), *reads]:
        selector = request.params.get("labelSelector") or ""
        assert set(selector.split(",")) >= {
            "kvpool.dev/pool",
            "app.kubernetes.io/managed-by=kvpool",
        }, request.params
    # what that selector lets through: the engine Deployment only
    selected = kube_api.client.get(
        core("deployments", api="apps/v1")
        + "?labelSelector="
        + urllib.parse.quote(reads[0].params["labelSelector"])
    )
    assert [d["metadata"]["name"] for d in selected["items"]] == ["chat-stable"]


def test_a_missing_tier_policy_blocks_changes_until_it_appears(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    # Given a pool whose policy does not exist
    kube_api.client.create(mp(), pool_builder().dict())

    # Then it says so, and no engine workload is created
    wait_until(lambda: condition(status(kube_api), "Ready") == ("False", "TierPolicyNotFound"))
    assert status(kube_api)["phase"] == "Error"
    assert names(kube_api, "deployments", "apps/v1") == []
    assert "TierPolicyNotFound" in wait_until(lambda: events(kube_api))

    # When the policy appears, the pool recovers
    kube_api.client.create(tp(), standard_tierpolicy_manifest().dict())
    wait_until(lambda: condition(status(kube_api), "Ready") == ("False", "ReplicasNotReady"))
    assert names(kube_api, "deployments", "apps/v1") == ["chat-stable"]
    assert status(kube_api)["plan"]["replicas"] == 2

    # When the policy is deleted while the pool uses it, its in-use finalizer holds it
    wait_until(lambda: "kvpool.dev/in-use" in kube_api.client.get(tp("tiers"))["metadata"].get(
        "finalizers", []))  # fmt: skip
    kube_api.client.delete(tp("tiers"))
    policy = wait_until(
        lambda: (
            (p := kube_api.client.get(tp("tiers"))).get("status")
            and condition(p["status"], "Ready") == ("True", "InUse")
            and p
        )
    )
    assert policy["metadata"]["deletionTimestamp"]
    assert "chat" in next(c["message"] for c in policy["status"]["conditions"])
    assert condition(status(kube_api), "Ready") == ("False", "ReplicasNotReady")

    # When someone removes the finalizer by hand, the policy goes; the Deployment is left
    # as it is and the last plan is kept (and said to be kept)
    kube_api.client.patch(tp("tiers"), {"metadata": {"finalizers": None}})
    wait_until(lambda: condition(status(kube_api), "Ready") == ("False", "TierPolicyNotFound"))
    dep = kube_api.client.get(core("deployments", "chat-stable", api="apps/v1"))
    assert dep["spec"]["replicas"] == 2
    assert status(kube_api)["plan"]["replicas"] == 2  # the last plan is kept
    assert condition(status(kube_api), "ConfigStale") == ("True", "KeptLastGood")
    kept = wait_until(lambda: admission_config(kube_api)["tierPolicies"][0])
    assert kept["name"] == "tiers" and kept["stale"] is True


def test_deleting_a_pool_removes_its_children_and_its_config_entry(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    given_policy_tenant_and_pool(kube_api)
    kube_api.client.create(mp(), pool_builder("other").dict())
    wait_until(lambda: len(names(kube_api, "services")) == 2)
    wait_until(lambda: len(admission_config(kube_api)["pools"]) == 2)

    kube_api.client.delete(mp("chat"))

    wait_until(lambda: names(kube_api, "deployments", "apps/v1") == ["other-stable"])
    wait_until(lambda: names(kube_api, "services") == ["other-stable"])
    wait_until(lambda: names(kube_api, "poddisruptionbudgets", "policy/v1") == ["other"])
    wait_until(lambda: [p["name"] for p in admission_config(kube_api)["pools"]] == ["other"])
    assert kube_api.client.request("GET", mp("chat")).status == 404  # the finalizer was released


def test_pods_become_endpoints_and_static_endpoints_serve_local_mode(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: admission_config(kube_api)["pools"])

    # When an engine pod of the pool gets an IP and becomes ready
    pod = {
        "metadata": {
            "name": "chat-stable-abc",
            "labels": {"kvpool.dev/pool": "chat", "kvpool.dev/track": "stable"},
        },
        "spec": {"containers": [{"name": "engine", "image": "x"}]},
    }
    kube_api.client.create(core("pods"), pod)
    kube_api.client.patch(
        core("pods", "chat-stable-abc") + "/status",
        {"status": {"podIP": "10.1.2.3", "conditions": [{"type": "Ready", "status": "True"}]}},
    )
    endpoints = lambda: admission_config(kube_api)["pools"][0]["tracks"][0]["endpoints"]  # noqa: E731
    wait_until(
        lambda: (
            endpoints()
            == [{"name": "chat-stable-abc", "url": "http://10.1.2.3:8000", "ready": True}]
        )
    )

    # When the pool declares static endpoints (local mode), they are used instead
    kube_api.client.patch(
        mp("chat"),
        {"metadata": {"annotations": {"kvpool.dev/static-endpoints": "e1=http://127.0.0.1:8001"}}},
    )
    wait_until(
        lambda: endpoints() == [{"name": "e1", "url": "http://127.0.0.1:8001", "ready": True}]
    )
    wait_until(lambda: status(kube_api)["replicas"]["ready"] == 1)


def test_static_endpoints_are_ignored_without_the_local_mode_flag(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    # Given an operator as a cluster runs it (no --allow-static-endpoints)
    with run_operator(kube_api, tmp_path, allow_static_endpoints=False) as op:
        given_policy_tenant_and_pool(kube_api)
        wait_until(lambda: admission_config(kube_api)["pools"])

        # When someone annotates the pool to send its traffic elsewhere
        kube_api.client.patch(
            mp("chat"),
            {"metadata": {"annotations": {"kvpool.dev/static-endpoints": "e=http://evil:1"}}},
        )
        wait_until(lambda: "static-endpoints ignored" in op.log(), timeout=10)

        # Then the config's endpoints stay those of the pool's pods (none here)
        assert admission_config(kube_api)["pools"][0]["tracks"][0]["endpoints"] == []
        assert status(kube_api)["replicas"]["ready"] == 0


def test_restart_mid_reconcile_creates_no_duplicates(kube_api: KubeApi, tmp_path: Path) -> None:
    # Given an operator that pauses 2 s between child writes
    op = OperatorProcess(kube_api, tmp_path, env={"KVPOOL_TESTING_APPLY_DELAY": "2"})
    try:
        op.start()
        given_policy_tenant_and_pool(kube_api)
        # When it is killed after the Deployment, before the Service
        wait_until(
            lambda: names(kube_api, "deployments", "apps/v1") == ["chat-stable"], interval=0.05
        )
        assert names(kube_api, "services") == []
        op.restart(kill=True, env={"KVPOOL_TESTING_APPLY_DELAY": "0"})

        # Then the restarted operator finishes the job, with one object of each
        wait_until(lambda: status(kube_api).get("plan"))
        wait_until(lambda: names(kube_api, "poddisruptionbudgets", "policy/v1") == ["chat"])
        assert names(kube_api, "deployments", "apps/v1") == ["chat-stable"]
        assert names(kube_api, "services") == ["chat-stable"]
        assert names(kube_api, "configmaps") == ["kvpool-admission"]

        # And a graceful restart with nothing changed writes nothing
        before = kube_api.client.get(core("deployments", "chat-stable", api="apps/v1"))["metadata"][
            "resourceVersion"
        ]
        op.restart(kill=False)
        wait_until(lambda: 'kvpool_operator_reconciles_total{result="ok"}' in op.metrics())
        after = kube_api.client.get(core("deployments", "chat-stable", api="apps/v1"))["metadata"][
            "resourceVersion"
        ]
        assert before == after
    finally:
        op.stop()


def test_api_server_errors_are_retried(kube_api: KubeApi, operator: OperatorProcess) -> None:
    # Given an API server that refuses the first Deployment creations and status writes
    kube_api.emulator["post", kmock.resource("apps", "v1", "deployments")][:2] << 503
    kube_api.emulator["patch", kmock.resource("kvpool.dev", "v1alpha1", "modelpools")][:1] << 429
    given_policy_tenant_and_pool(kube_api)

    # Then the operator gets there anyway
    wait_until(lambda: status(kube_api).get("plan"))
    assert names(kube_api, "deployments", "apps/v1") == ["chat-stable"]
    assert len(kube_api.emulator["post", kmock.resource("apps", "v1", "deployments")]) >= 3


def test_health_and_own_metrics(kube_api: KubeApi, operator: OperatorProcess) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: status(kube_api).get("plan"))
    assert operator.healthy()
    text = wait_until(
        lambda: (
            'kvpool_operator_config_publishes_total{action="created"}' in operator.metrics()
            and operator.metrics()
        )
    )
    assert 'kvpool_operator_reconciles_total{result="ok"}' in text
    assert "kvpool_operator_reconcile_duration_seconds_bucket" in text
    assert 'kvpool_operator_plans_total{outcome="Planned"}' in text
    assert 'kvpool_operator_warm_replicas{namespace="default",pool="chat"} 2.0' in text


def test_kubectl_shows_the_printer_columns(kube_api: KubeApi, operator: OperatorProcess) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: status(kube_api).get("plan"))
    out = kube_api.kubectl("get", "kvpool", "-A").stdout
    header, row = next(
        (line, out.splitlines()[i + 1]) for i, line in enumerate(out.splitlines()) if "WARM" in line
    )
    for column in ("READY", "WARM", "KV/REPLICA", "TOP TIER FLOOR", "PHASE"):
        assert column in header
    assert row.split()[:7] == [
        "default",
        "modelpool.kvpool.dev/chat",
        "0",
        "2",
        "3000",
        "2700",
        "Pending",
    ]
    # a tenant whose key Secret is missing is not ready, and `get kvpool -A` says so
    broken = tenantbudget_manifest("ghost").tiers("interactive").dict()
    kube_api.client.create(tb(), broken)
    wait_until(lambda: (kube_api.client.get(tb("ghost")).get("status") or {}).get("conditions"))
    lines = kube_api.kubectl("get", "kvpool", "-A").stdout.splitlines()
    budget_header = next(line for line in lines if "OVER BUDGET" in line)
    assert budget_header.split()[-2:] == ["READY", "AGE"]
    (ghost,) = [line for line in lines if "tenantbudget.kvpool.dev/ghost" in line]
    assert ghost.split()[-2] == "False", ghost


def test_the_playground_shows_the_examples_planned() -> None:
    # The README's "try it without a cluster" command
    run = subprocess.run(
        [sys.executable, "-m", "tests.operator_playground", "--once"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert any(line.startswith("kubectl --kubeconfig") for line in lines)
    rows = {line.split()[1]: line.split() for line in lines if "modelpool.kvpool.dev/" in line}
    assert rows["modelpool.kvpool.dev/llama-8b"][3:5] == ["4", "400000"]  # WARM, KV/REPLICA


def test_the_playground_stops_its_operator_on_sigterm() -> None:
    playground = subprocess.Popen(
        [sys.executable, "-m", "tests.operator_playground"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert playground.stdout is not None
        lines = []
        for line in playground.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C to stop"):
                break
        (pid,) = [int(m) for line in lines for m in re.findall(r"operator pid (\d+)", line)]
        os.kill(pid, 0)  # running

        playground.send_signal(signal.SIGTERM)
        assert playground.wait(timeout=60) == 0
    finally:
        playground.kill()
        playground.wait()
        if playground.stdout is not None:
            playground.stdout.close()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, timeout=10)


def test_a_pool_deleted_while_the_operator_was_down_is_cleaned_up(
    kube_api: KubeApi, tmp_path: Path
) -> None:
    op = OperatorProcess(kube_api, tmp_path)
    try:
        op.start()
        given_policy_tenant_and_pool(kube_api)
        wait_until(lambda: names(kube_api, "poddisruptionbudgets", "policy/v1") == ["chat"])
        # (the finalizer was written before the first child: kopf's own comes later)
        assert "kvpool.dev/operator" in kube_api.client.get(mp("chat"))["metadata"]["finalizers"]
        op.stop()

        # When the pool is deleted while no operator runs, its finalizer holds it
        kube_api.client.delete(mp("chat"))
        assert kube_api.client.get(mp("chat"))["metadata"]["deletionTimestamp"]

        # Then the restarted operator removes the children and lets the pool go
        op.start()
        wait_until(lambda: kube_api.client.request("GET", mp("chat")).status == 404)
        assert names(kube_api, "deployments", "apps/v1") == []
        assert names(kube_api, "services") == []
        assert names(kube_api, "poddisruptionbudgets", "policy/v1") == []
    finally:
        op.stop()


def test_hand_edits_of_owned_fields_are_restored(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    given_policy_tenant_and_pool(kube_api)
    deployment = core("deployments", "chat-stable", api="apps/v1")
    wait_until(lambda: kube_api.client.get(deployment))
    image = kube_api.client.get(deployment)["spec"]["template"]["spec"]["containers"][0]["image"]

    # When someone patches the engine image and the Service selector by hand
    # (kvpool's spec-hash annotation stays as it was)
    ops = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil"}]
    kube_api.client.json_patch(deployment, ops)
    kube_api.client.patch(core("services", "chat-stable"), {"spec": {"selector": {"x": "y"}}})

    # Then the next reconcile (a timer tick at most) puts back what kvpool owns, and says so
    wait_until(
        lambda: (
            kube_api.client.get(deployment)["spec"]["template"]["spec"]["containers"][0]["image"]
            == image
        )
    )
    wait_until(
        lambda: (
            kube_api.client.get(core("services", "chat-stable"))["spec"]["selector"]
            == {"kvpool.dev/pool": "chat", "kvpool.dev/track": "stable"}
        )
    )
    assert "DriftRestored" in wait_until(lambda: events(kube_api))

    # When someone rewrites the compiled config by hand, it is put back too
    good = wait_until(lambda: admission_config(kube_api)["pools"] and admission_config(kube_api))
    forged = json.dumps(good | {"tenants": []})
    kube_api.client.patch(core("configmaps", "kvpool-admission"), {"data": {"config.json": forged}})
    wait_until(lambda: admission_config(kube_api)["tenants"] == good["tenants"])
