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

from tests.builders import (
    apikey_secret_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
)
from tests.integration.test_operator import (
    API_KEY,
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


@pytest.mark.parametrize(
    ("zed_secret", "zed_value"),
    [("acme-key", None), ("zed-key", API_KEY)],
    ids=["two-budgets-on-one-secret-key", "two-secrets-with-equal-values"],
)
def test_one_api_key_for_two_tenants_serves_neither_and_says_who_else(
    kube_api: KubeApi, operator: OperatorProcess, zed_secret: str, zed_value: str | None
) -> None:
    # Given acme published with its key
    given_policy_tenant_and_pool(kube_api)
    wait_until(lambda: [t["tenant"] for t in admission_config(kube_api)["tenants"]] == ["acme"])

    # When zed is added with the same key (the same Secret key, or another Secret with
    # the same value)
    if zed_value is not None:
        kube_api.client.create(
            core("secrets"), apikey_secret_manifest(zed_secret, "api-key", zed_value)
        )
    zed = tenantbudget_manifest("zed").spec(apiKeySecretRef={"name": zed_secret, "key": "api-key"})
    kube_api.client.create(resource_path(API, "tenantbudgets", "default"), zed.dict())

    # Then neither is published, and each one's Ready condition names the other
    def ready(name: str) -> tuple[str, str]:
        return condition(obj(kube_api, "TenantBudget", name)["status"], "Ready")

    wait_until(
        lambda: ready("acme")[0] == ready("zed")[0] == "False", 30, "both TenantBudgets Ready=False"
    )
    tenants = [t["tenant"] for t in admission_config(kube_api)["tenants"]]
    assert tenants == [], f"published with one key for acme and zed: {tenants}"
    for name, other in (("acme", "zed"), ("zed", "acme")):
        found = next(
            c for c in obj(kube_api, "TenantBudget", name)["status"]["conditions"]
            if c["type"] == "Ready"
        )  # fmt: skip
        assert found["reason"] == "DuplicateApiKey", (name, found)
        assert f"TenantBudget {other!r}" in found["message"], (name, found["message"])

    # When zed gets its own key, both are served again
    kube_api.client.create(core("secrets"), apikey_secret_manifest("zed-own", "api-key", "sk-z"))
    kube_api.client.patch(
        resource_path(API, "tenantbudgets", "default", "zed"),
        {"spec": {"apiKeySecretRef": {"name": "zed-own", "key": "api-key"}}},
    )
    wait_until(
        lambda: (
            sorted(t["tenant"] for t in admission_config(kube_api)["tenants"]) == ["acme", "zed"]
        ),
        30,
        "both tenants published again",
    )
