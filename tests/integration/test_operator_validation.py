"""The operator never acts on, or publishes, an object that ``kvpool validate`` refuses.

An API server with the CRDs' schema and CEL rules would refuse these objects, but the
operator must not rely on that (older servers, ``--validate=false`` paths, objects stored
before a CRD upgrade). So each invalid object of the table is written straight into the
emulator's storage (no validation), over a valid baseline that is already published.

Then: the object says why (``Ready=False``, the field path and reason in the message),
a Warning Event says it too, no engine workload changes, and the compiled config keeps
the last valid version (marked ``stale``) or leaves the object out; fixing the object
recovers everything.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.builders import standard_tierpolicy_manifest, tenantbudget_manifest
from tests.integration.test_operator import (
    admission_config,
    condition,
    core,
    given_policy_tenant_and_pool,
    mp,
    names,
)
from tests.invalid_objects import INVALID_CASES, PLURALS, InvalidCase, baseline_pool
from tests.operator_process import OperatorProcess
from tests.support.kube import KubeApi, resource_path
from tests.support.waiting import wait_until

API = "kvpool.dev/v1alpha1"
BASELINE = {
    "TierPolicy": lambda: standard_tierpolicy_manifest().dict(),
    "ModelPool": lambda: baseline_pool().dict(),
    "TenantBudget": lambda: (
        tenantbudget_manifest("acme").tiers("interactive", "batch").limit("1h", 10_000).dict()
    ),
}


def obj(kube: KubeApi, kind: str, name: str) -> dict[str, Any]:
    return kube.client.get(resource_path(API, PLURALS[kind], "default", name))  # type: ignore[no-any-return]


def store(kube: KubeApi, body: dict[str, Any]) -> None:
    """Write into storage as an old server or a pre-upgrade object would: no checks."""
    kube.call(lambda emulator: emulator.store(API, PLURALS[body["kind"]], body))


def warnings(kube: KubeApi, kind: str, name: str) -> list[tuple[str, str]]:
    items = kube.client.get(core("events"))["items"]
    return [
        (e["reason"], e["message"])
        for e in items
        if e["type"] == "Warning"
        and e["involvedObject"]["kind"] == kind
        and e["involvedObject"]["name"] == name
    ]


def unstale(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("stale", "staleReason")}


def by_name(config: dict[str, Any], section: str) -> dict[str, dict[str, Any]]:
    key = "tenant" if section == "tenants" else "name"
    return {e[key]: e for e in config[section]}


@pytest.mark.parametrize("case", INVALID_CASES, ids=[c.id for c in INVALID_CASES])
def test_an_invalid_object_is_flagged_never_published_and_recovers(
    kube_api: KubeApi, operator: OperatorProcess, case: InvalidCase
) -> None:
    # Given a valid policy, tenant and pool, planned and published
    given_policy_tenant_and_pool(kube_api)
    before = wait_until(
        lambda: (
            (c := admission_config(kube_api))["pools"]
            and c["pools"][0]["replicas"] == 2
            and c["tenants"]
            and c
        )
    )
    deployment = core("deployments", "chat-stable", api="apps/v1")
    rv = wait_until(lambda: kube_api.client.get(deployment)["metadata"]["resourceVersion"])
    name = case.body["metadata"]["name"]

    # When the invalid object is written straight into storage
    store(kube_api, case.body)

    # Then it says why, with the field path and the reason (not "1 validation error")
    status = wait_until(
        lambda: (
            (s := obj(kube_api, case.kind, name).get("status") or {})
            and condition(s, "Ready") == ("False", "InvalidSpec")
            and s
        )
    )
    message = next(c["message"] for c in status["conditions"] if c["type"] == "Ready")
    assert f"{case.path}: {case.reason}" in message, message
    # And a Warning Event says the same
    reported = wait_until(lambda: warnings(kube_api, case.kind, name))
    assert any(r == "InvalidSpec" and case.path in m for r, m in reported), reported

    # And what the gateway enforces is the last valid version, marked stale (or nothing)
    if case.kind == "TierPolicy":
        pool = wait_until(lambda: condition(obj(kube_api, "ModelPool", "chat")["status"], "Ready"))
        wait_until(
            lambda: (
                condition(obj(kube_api, "ModelPool", "chat")["status"], "Ready")
                == ("False", "TierPolicyInvalid")
            )
        )
        kept = wait_until(lambda: by_name(admission_config(kube_api), "tierPolicies")["tiers"])
        assert kept["stale"] is True and "invalid" in kept["staleReason"]
        assert unstale(kept) == by_name(before, "tierPolicies")["tiers"]
        assert pool is not None
    elif case.kind == "ModelPool":
        kept = wait_until(
            lambda: (p := by_name(admission_config(kube_api), "pools")["chat"]).get("stale") and p
        )
        assert unstale(kept) == by_name(before, "pools")["chat"]
        # the status keeps the last good plan, saying it was made for the last generation
        st = obj(kube_api, "ModelPool", "chat")["status"]
        assert st["observedGeneration"] == 2 and st["plan"]["observedGeneration"] == 1
        assert condition(st, "ConfigStale") == ("True", "KeptLastGood")
    else:
        wait_until(lambda: admission_config(kube_api)["tenants"] == [])
    # And no engine workload was touched
    assert kube_api.client.get(deployment)["metadata"]["resourceVersion"] == rv

    # When the object is fixed, everything recovers
    store(kube_api, BASELINE[case.kind]())
    ready = lambda kind, n: condition(obj(kube_api, kind, n)["status"], "Ready")  # noqa: E731
    wait_until(lambda: ready(case.kind, name)[1] not in ("InvalidSpec", "TierPolicyInvalid"))
    wait_until(lambda: ready("ModelPool", "chat") == ("False", "ReplicasNotReady"))
    after = wait_until(
        lambda: (
            (c := admission_config(kube_api))["tenants"]
            and not any(e.get("stale") for e in [*c["pools"], *c["tierPolicies"]])
            and c
        )
    )
    assert [p["name"] for p in after["pools"]] == ["chat"]


def test_a_pool_invalid_from_the_start_gets_no_workload_and_no_config_entry(
    kube_api: KubeApi, operator: OperatorProcess
) -> None:
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: admission_config(kube_api)["pools"])

    # When a second pool names a tier the policy lacks, and a third serves chat's model name
    kube_api.client.create(mp(), baseline_pool("other").peak(premium=2).dict())
    clash = baseline_pool("clash").dict()
    clash["spec"]["model"]["servedName"] = "chat"
    kube_api.client.create(mp(), clash)

    # Then both are InvalidSpec, get no Deployment, and the config serves chat alone
    for pool, path in (("other", "spec.capacity.peakConcurrency.premium"),
                       ("clash", "spec.model.servedName")):  # fmt: skip
        st = wait_until(lambda p=pool: obj(kube_api, "ModelPool", p).get("status"))
        assert condition(st, "Ready") == ("False", "InvalidSpec")
        assert path in next(c["message"] for c in st["conditions"] if c["type"] == "Ready")
        assert "plan" not in st
    assert names(kube_api, "deployments", "apps/v1") == ["chat-stable"]
    assert [p["name"] for p in admission_config(kube_api)["pools"]] == ["chat"]
