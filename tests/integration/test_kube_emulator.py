"""The Kubernetes API emulator behaves as our operator, kopf and kubectl need it to.

Each behaviour the operator relies on is pinned by a test (tests/support/kube_emulator.py
explains why each exists); then the two proofs that matter: a real kopf operator handles
a ModelPool's create/update/delete and patches its status against the emulator, and
``kubectl`` lists our kinds with the printer columns of crds/*.yaml.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import kmock
import kopf
import pytest
from kopf.testing import KopfRunner

from kvpool.api import API_VERSION
from tests.builders import (
    declared_modelpool_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
)
from tests.support.emulator import kopf_peering_crds
from tests.support.kube import JSON_PATCH, MERGE_PATCH, KubeApi, load_crds, resource_path
from tests.support.waiting import wait_until, wait_until_async

CRDS = load_crds()
FINALIZER = "kvpool.dev/test-cleanup"


# --- builders --------------------------------------------------------------------------------


def pools(
    namespace: str | None = "default", name: str | None = None, sub: str | None = None
) -> str:
    return resource_path(API_VERSION, "modelpools", namespace, name, sub)


def build_pool(
    name: str = "",
    *,
    generate_name: str = "",
    model: str = "tiny",
    labels: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} if name else {"generateName": generate_name}
    if labels:
        meta["labels"] = labels
    if finalizers:
        meta["finalizers"] = finalizers
    spec = declared_modelpool_manifest().dict()[
        "spec"
    ]  # valid: the emulator enforces the CRD schema
    spec["model"]["name"] = model
    return {"apiVersion": API_VERSION, "kind": "ModelPool", "metadata": meta,
            "spec": spec, **extra}  # fmt: skip


VALID_SPECS = {
    "ModelPool": lambda: declared_modelpool_manifest().dict()["spec"],
    "TierPolicy": lambda: standard_tierpolicy_manifest().dict()["spec"],
    "TenantBudget": lambda: tenantbudget_manifest("acme").dict()["spec"],
}


def build_object(crd: dict[str, Any], name: str) -> dict[str, Any]:
    """A valid object of a CRD's kind (the emulator enforces the CRD's schema and rules)."""
    version = crd["spec"]["versions"][0]["name"]
    kind = crd["spec"]["names"]["kind"]
    return {"apiVersion": f"{crd['spec']['group']}/{version}", "kind": kind,
            "metadata": {"name": name}, "spec": VALID_SPECS.get(kind, dict)()}  # fmt: skip


def crd_path(crd: dict[str, Any], namespace: str | None = "default") -> str:
    version = crd["spec"]["versions"][0]["name"]
    api_version = f"{crd['spec']['group']}/{version}"
    return resource_path(api_version, crd["spec"]["names"]["plural"], namespace)


def events_of(kube_api: KubeApi, path: str, **params: str) -> list[tuple[str, str]]:
    """(type, name) of each event a watch yields until its timeout (default 0.3 s)."""
    params.setdefault("timeoutSeconds", "0.3")
    return [
        (e["type"], e["object"]["metadata"]["name"]) for e in kube_api.client.watch(path, **params)
    ]


@pytest.fixture
def pool(kube_api: KubeApi) -> Any:
    """ModelPool default/a with status.phase Pending."""
    kube_api.client.create(pools(), build_pool("a"))
    return kube_api.client.patch(pools(name="a", sub="status"), {"status": {"phase": "Pending"}})


# --- objects -----------------------------------------------------------------------------------


def test_create_answers_201_with_server_fields_and_no_status(kube_api: KubeApi) -> None:
    rsp = kube_api.client.request("POST", pools(), build_pool("a", status={"phase": "Fake"}))

    assert rsp.status == 201
    meta = rsp.body["metadata"]
    assert uuid.UUID(meta["uid"])
    assert int(meta["resourceVersion"]) > 0
    assert datetime.datetime.fromisoformat(meta["creationTimestamp"]).tzinfo is not None
    assert meta["generation"] == 1
    assert "status" not in rsp.body  # the status subresource owns it
    assert kube_api.client.get(pools(name="a")) == rsp.body


def test_generate_name_gives_distinct_names_with_the_prefix(kube_api: KubeApi) -> None:
    names = [
        kube_api.client.create(pools(), build_pool(generate_name="pool-"))["metadata"]["name"]
        for _ in range(3)
    ]

    assert len(set(names)) == 3
    assert all(n.startswith("pool-") and len(n) > len("pool-") for n in names)


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (build_pool("a"), 409, "AlreadyExists"),
        ({"metadata": {}, "spec": {}}, 422, "Invalid"),
    ],
    ids=["same-name", "no-name"],
)
def test_create_refusals(kube_api: KubeApi, body: dict[str, Any], status: int, reason: str) -> None:
    kube_api.client.create(pools(), build_pool("a"))

    rsp = kube_api.client.request("POST", pools(), body)

    assert (rsp.status, rsp.body["reason"]) == (status, reason)


def test_resource_versions_grow_across_kinds(kube_api: KubeApi) -> None:
    cms = resource_path("v1", "configmaps", "default")
    created = [
        kube_api.client.create(path, {"metadata": {"name": f"o{i}"}, **body})
        for i, (path, body) in enumerate(
            [
                (pools(), {"spec": build_pool()["spec"]}),
                (cms, {}),
                (pools(), {"spec": build_pool()["spec"]}),
            ]
        )
    ]
    versions = [int(obj["metadata"]["resourceVersion"]) for obj in created]

    assert versions == sorted(versions)
    assert len(set(versions)) == 3
    assert int(kube_api.client.get(pools())["metadata"]["resourceVersion"]) == versions[-1]


# --- status subresource, generation, conflicts ----------------------------------------------


@pytest.mark.parametrize(
    ("sub", "content_type", "patch", "model", "phase"),
    [
        (None, MERGE_PATCH, {"spec": {"model": {"name": "big"}}, "status": {"phase": "Hacked"}},
         "big", "Pending"),
        ("status", MERGE_PATCH, {"spec": {"model": {"name": "big"}}, "status": {"phase": "Ready"}},
         "tiny", "Ready"),
        (None, JSON_PATCH, [{"op": "replace", "path": "/spec/model/name", "value": "big"},
                            {"op": "replace", "path": "/status/phase", "value": "Hacked"}],
         "big", "Pending"),
        ("status", JSON_PATCH, [{"op": "replace", "path": "/spec/model/name", "value": "big"},
                                {"op": "replace", "path": "/status/phase", "value": "Ready"}],
         "tiny", "Ready"),
    ],
    ids=["main-merge-keeps-status", "status-merge-keeps-spec",
         "main-json-keeps-status", "status-json-keeps-spec"],
)  # fmt: skip
def test_status_subresource_is_isolated_from_spec(
    kube_api: KubeApi, pool: dict[str, Any], sub: str | None, content_type: str, patch: Any,
    model: str, phase: str,
) -> None:  # fmt: skip
    rsp = kube_api.client.request(
        "PATCH", pools(name="a", sub=sub), patch, content_type=content_type
    )

    assert rsp.status == 200
    stored = kube_api.client.get(pools(name="a"))
    assert (stored["spec"]["model"]["name"], stored["status"]["phase"]) == (model, phase)
    assert rsp.body == stored


@pytest.mark.parametrize(
    ("sub", "patch", "generation_step", "new_version"),
    [
        (None, {"spec": {"model": {"name": "big"}}}, 1, True),
        (None, {"metadata": {"labels": {"team": "x"}}}, 0, True),
        (None, {"metadata": {"annotations": {"kopf.zalando.org/x": "y"}}}, 0, True),
        ("status", {"status": {"phase": "Ready"}}, 0, True),
        (None, {"spec": {"model": {"name": "tiny"}}}, 0, False),
    ],
    ids=["spec-bumps", "labels-keep", "annotations-keep", "status-keeps", "no-op-changes-nothing"],
)
def test_generation_bumps_only_on_spec_changes(
    kube_api: KubeApi, pool: dict[str, Any], sub: str | None, patch: dict[str, Any],
    generation_step: int, new_version: bool,
) -> None:  # fmt: skip
    after = kube_api.client.patch(pools(name="a", sub=sub), patch)

    assert after["metadata"]["generation"] == pool["metadata"]["generation"] + generation_step
    changed = after["metadata"]["resourceVersion"] != pool["metadata"]["resourceVersion"]
    assert changed == new_version


@pytest.mark.parametrize(
    ("content_type", "stale", "status"),
    [(MERGE_PATCH, True, 409), (MERGE_PATCH, False, 200),
     (JSON_PATCH, True, 422), (JSON_PATCH, False, 200)],
    ids=["merge-stale-409", "merge-current-ok", "json-test-stale-422", "json-test-current-ok"],
)  # fmt: skip
def test_a_stale_resource_version_is_refused(
    kube_api: KubeApi, content_type: str, stale: bool, status: int
) -> None:
    old = kube_api.client.create(pools(), build_pool("a"))["metadata"]["resourceVersion"]
    current = kube_api.client.patch(pools(name="a"), {"metadata": {"labels": {"x": "1"}}})
    version = old if stale else current["metadata"]["resourceVersion"]
    patch: Any = {"metadata": {"resourceVersion": version}, "spec": {"model": {"name": "big"}}}
    if content_type == JSON_PATCH:  # how kopf guards its JSON patches
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": version},
                 {"op": "replace", "path": "/spec/model/name", "value": "big"}]  # fmt: skip

    rsp = kube_api.client.request("PATCH", pools(name="a"), patch, content_type=content_type)

    assert rsp.status == status
    model = kube_api.client.get(pools(name="a"))["spec"]["model"]["name"]
    assert model == ("tiny" if stale else "big")


# --- deletion ----------------------------------------------------------------------------------


def test_finalizers_delay_deletion_until_removed(kube_api: KubeApi) -> None:
    created = kube_api.client.create(pools(), build_pool("a", finalizers=[FINALIZER]))
    since = created["metadata"]["resourceVersion"]

    kube_api.client.delete(pools(name="a"))
    marked = kube_api.client.get(pools(name="a"))
    kube_api.client.delete(pools(name="a"))  # again: nothing changes
    assert kube_api.client.get(pools(name="a")) == marked
    kube_api.client.patch(pools(name="a"), {"metadata": {"finalizers": None}})

    assert marked["metadata"]["deletionTimestamp"]
    assert kube_api.client.request("GET", pools(name="a")).status == 404
    assert events_of(kube_api, pools(), resourceVersion=since) == [
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]


def test_delete_without_finalizers_removes_at_once(kube_api: KubeApi) -> None:
    kube_api.client.create(pools(), build_pool("a"))

    deleted = kube_api.client.delete(pools(name="a"))

    assert deleted["metadata"]["name"] == "a"
    assert kube_api.client.request("GET", pools(name="a")).status == 404
    assert kube_api.client.request("DELETE", pools(name="a")).status == 404


# --- watch -------------------------------------------------------------------------------------


@pytest.fixture
def history(kube_api: KubeApi) -> dict[str, str]:
    """Create a, create b, modify a; the resourceVersion after each step."""
    client = kube_api.client
    a_created = client.create(pools(), build_pool("a"))
    b_created = client.create(pools(), build_pool("b"))
    a_modified = client.patch(pools(name="a"), {"spec": {"model": {"name": "big"}}})
    steps = {"a-created": a_created, "b-created": b_created, "a-modified": a_modified}
    return {step: obj["metadata"]["resourceVersion"] for step, obj in steps.items()}


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        (None, [("ADDED", "a"), ("ADDED", "b")]),
        ("a-created", [("ADDED", "b"), ("MODIFIED", "a")]),
        ("b-created", [("MODIFIED", "a")]),
        ("a-modified", []),
    ],
    ids=[
        "no-version-lists-current-state",
        "resumes-after-create",
        "resumes-after-second",
        "at-head",
    ],
)
def test_watch_resumes_after_the_given_resource_version(
    kube_api: KubeApi, history: dict[str, str], since: str | None, expected: list[tuple[str, str]]
) -> None:
    params = {"resourceVersion": history[since]} if since else {}

    assert events_of(kube_api, pools(), **params) == expected


def test_timeout_seconds_ends_an_idle_watch(kube_api: KubeApi) -> None:
    started = time.monotonic()

    events = list(kube_api.client.watch(pools(), timeoutSeconds="1"))

    assert events == []
    assert 0.9 <= time.monotonic() - started < 3


def test_initial_events_end_with_a_bookmark(kube_api: KubeApi, history: dict[str, str]) -> None:
    events = list(kube_api.client.watch(pools(), sendInitialEvents="true", timeoutSeconds="0.3"))

    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    bookmark = events[-1]["object"]["metadata"]
    assert bookmark["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert bookmark["resourceVersion"] == history["a-modified"]


async def test_watch_delivers_changes_made_while_it_is_open(kube_api: KubeApi) -> None:
    async with kube_api.async_client() as client:
        since = (await client.get(pools()))["metadata"]["resourceVersion"]
        seen: list[tuple[str, str]] = []

        async def follow() -> None:
            async for event in client.watch(pools(), resourceVersion=since, timeoutSeconds="5"):
                seen.append((event["type"], event["object"]["metadata"]["name"]))
                if len(seen) == 2:
                    return

        watching = asyncio.create_task(follow())
        # resuming from `since` would cover a late connection; waiting keeps the test honest
        await wait_until_async(lambda: len(kube_api.emulator[kmock.action.WATCH]), 5, "a watch")
        await client.create(pools(), build_pool("a"))
        await client.delete(pools(name="a"))
        await asyncio.wait_for(watching, timeout=5)

    assert seen == [("ADDED", "a"), ("DELETED", "a")]


# --- selectors ---------------------------------------------------------------------------------

LABELLED = {
    "a": {"app": "chat", "tier": "gold"},
    "b": {"app": "chat"},
    "c": {"app": "code", "tier": "x"},
}


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("app=chat", ["a", "b"]),
        ("app==chat", ["a", "b"]),
        ("app!=chat", ["c"]),
        ("app in (chat, code)", ["a", "b", "c"]),
        ("app notin (chat)", ["c"]),
        ("tier", ["a", "c"]),
        ("!tier", ["b"]),
        ("app=chat,tier=gold", ["a"]),
        ("app=none", []),
        ("", ["a", "b", "c"]),
    ],
    ids=["equals", "double-equals", "not-equals", "in", "notin", "exists", "not-exists", "and",
         "no-match", "empty"],
)  # fmt: skip
def test_label_selector_filters_lists(kube_api: KubeApi, selector: str, names: list[str]) -> None:
    for name, labels in LABELLED.items():
        kube_api.client.create(pools(), build_pool(name, labels=labels))

    listed = kube_api.client.get(pools(), labelSelector=selector)

    assert [o["metadata"]["name"] for o in listed["items"]] == names


def test_watch_with_a_label_selector_sees_objects_leave_and_enter(kube_api: KubeApi) -> None:
    since = kube_api.client.create(pools(), build_pool("a", labels={"app": "chat"}))["metadata"][
        "resourceVersion"]  # fmt: skip
    kube_api.client.patch(pools(name="a"), {"metadata": {"labels": {"app": "code"}}})
    kube_api.client.patch(pools(name="a"), {"spec": {"model": {"name": "big"}}})  # unseen
    kube_api.client.patch(pools(name="a"), {"metadata": {"labels": {"app": "chat"}}})

    events = events_of(kube_api, pools(), resourceVersion=since, labelSelector="app=chat")

    assert events == [("DELETED", "a"), ("ADDED", "a")]


# --- namespaces, lists, built-in kinds ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status"),
    [("/api/v1/namespaces", 200), ("/api/v1/namespaces/default", 200),
     ("/api/v1/namespaces/missing", 404)],
    ids=["list", "get", "get-missing"],
)  # fmt: skip
def test_namespaces_are_served(kube_api: KubeApi, path: str, status: int) -> None:
    assert kube_api.client.request("GET", path).status == status


def test_lists_carry_kind_api_version_and_resource_version(kube_api: KubeApi) -> None:
    kube_api.client.create(pools(), build_pool("a"))
    kube_api.client.create(pools("other"), build_pool("b"))

    everywhere = kube_api.client.get(pools(None))
    in_default = kube_api.client.get(pools())

    assert (everywhere["kind"], everywhere["apiVersion"]) == ("ModelPoolList", API_VERSION)
    assert everywhere["metadata"]["resourceVersion"].isdigit()
    assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in everywhere["items"]] == [
        ("default", "a"), ("other", "b")]  # fmt: skip
    assert [o["metadata"]["name"] for o in in_default["items"]] == ["a"]


@pytest.mark.parametrize(
    ("api_version", "plural", "kind"),
    [("v1", "configmaps", "ConfigMap"), ("v1", "secrets", "Secret"), ("v1", "services", "Service"),
     ("v1", "events", "Event"), ("v1", "pods", "Pod"), ("apps/v1", "deployments", "Deployment"),
     ("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget"),
     ("events.k8s.io/v1", "events", "Event"), ("coordination.k8s.io/v1", "leases", "Lease")],
    ids=str,
)  # fmt: skip
def test_builtin_kinds_the_operator_writes(
    kube_api: KubeApi, api_version: str, plural: str, kind: str
) -> None:
    path = resource_path(api_version, plural, "default")

    created = kube_api.client.create(
        path, {"metadata": {"name": "x", "labels": {"kvpool.dev/pool": "a"}}}
    )
    listed = kube_api.client.get(path, labelSelector="kvpool.dev/pool=a")

    assert (created["apiVersion"], created["kind"]) == (api_version, kind)
    assert listed["kind"] == f"{kind}List"
    assert [o["metadata"]["name"] for o in listed["items"]] == ["x"]


def test_deployment_generation_follows_its_spec(kube_api: KubeApi) -> None:
    path = resource_path("apps/v1", "deployments", "default")
    kube_api.client.create(path, {"metadata": {"name": "d"}, "spec": {"replicas": 1}})

    scaled = kube_api.client.patch(f"{path}/d", {"spec": {"replicas": 2}})
    reported = kube_api.client.patch(f"{path}/d/status", {"status": {"readyReplicas": 2}})

    assert (scaled["metadata"]["generation"], reported["metadata"]["generation"]) == (2, 2)
    assert reported["status"] == {"readyReplicas": 2}


@pytest.mark.parametrize(
    ("method", "path", "content_type", "status"),
    [("PUT", pools(name="a"), "application/json", 405),
     ("PATCH", pools(name="a"), "application/apply-patch+yaml", 415),
     ("GET", "/apis/kvpool.dev/v1alpha1/namespaces/default/unknowns", "application/json", 404),
     ("GET", "/apis/nowhere.dev/v1", "application/json", 404)],
    ids=["put-replace", "server-side-apply", "unknown-resource", "unknown-group"],
)  # fmt: skip
def test_what_is_not_emulated_is_refused_loudly(
    kube_api: KubeApi, method: str, path: str, content_type: str, status: int
) -> None:
    kube_api.client.create(pools(), build_pool("a"))

    rsp = kube_api.client.request(method, path, build_pool("a"), content_type=content_type)

    assert (rsp.status, rsp.body["kind"]) == (status, "Status")


def test_a_test_reaction_answers_first_and_changes_nothing(kube_api: KubeApi) -> None:
    kube_api.client.create(pools(), build_pool("a"))
    kube_api.emulator["patch"] << 503  # fault injection with kmock's DSL

    rsp = kube_api.client.request("PATCH", pools(name="a"), {"spec": {"model": {"name": "big"}}},
                                  content_type=MERGE_PATCH)  # fmt: skip

    assert rsp.status == 503
    assert kube_api.client.get(pools(name="a"))["spec"]["model"]["name"] == "tiny"
    assert len(kube_api.emulator["patch"]) == 1  # kmock's request log


# --- discovery -------------------------------------------------------------------------------


@pytest.mark.parametrize("crd", CRDS, ids=[c["metadata"]["name"] for c in CRDS])
def test_discovery_lists_our_crds(kube_api: KubeApi, crd: dict[str, Any]) -> None:
    group, names = crd["spec"]["group"], crd["spec"]["names"]
    version = crd["spec"]["versions"][0]

    groups = kube_api.client.get("/apis")["groups"]
    listed = kube_api.client.get(f"/apis/{group}/{version['name']}")["resources"]
    by_name = {r["name"]: r for r in listed}

    assert group in [g["name"] for g in groups]
    entry = by_name[names["plural"]]
    assert entry["kind"] == names["kind"]
    assert entry["shortNames"] == names.get("shortNames", [])
    assert entry["categories"] == names.get("categories", [])
    assert entry["namespaced"] == (crd["spec"]["scope"] == "Namespaced")
    assert {"list", "watch", "patch", "create", "delete"} <= set(entry["verbs"])
    assert (f"{names['plural']}/status" in by_name) == ("status" in version.get("subresources", {}))


def test_discovery_lists_the_core_api(kube_api: KubeApi) -> None:
    assert kube_api.client.get("/api")["versions"] == ["v1"]
    core = {r["name"]: r for r in kube_api.client.get("/api/v1")["resources"]}
    assert core["namespaces"]["namespaced"] is False
    assert core["configmaps"]["namespaced"] is True


# --- proof 1: a kopf operator against the emulator --------------------------------------------


@pytest.fixture
def kopf_operator(kube_api: KubeApi) -> Iterator[kopf.OperatorRegistry]:
    """A minimal operator: it reports the model it serves in status and records deletions."""
    registry = kopf.OperatorRegistry()
    resource = ("kvpool.dev", "v1alpha1", "modelpools")

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kube_api.connection_info()

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 10
        settings.posting.level = logging.WARNING

    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry)
    def serve(spec: kopf.Spec, meta: kopf.Meta, patch: kopf.Patch, **_: Any) -> None:
        # a field of the schema: the emulator prunes unknown status fields, as a server does
        patch.status["phase"] = spec["model"]["name"]
        patch.status["observedGeneration"] = meta["generation"]

    @kopf.on.delete(*resource, registry=registry)
    def cleanup(name: str, **_: Any) -> None:
        kube_api.client.create(resource_path("v1", "configmaps", "default"),
                               {"metadata": {"name": f"deleted-{name}"}})  # fmt: skip

    yield registry


def test_kopf_operator_handles_a_modelpool_lifecycle(
    kube_api: KubeApi, kopf_operator: kopf.OperatorRegistry
) -> None:
    client = kube_api.client
    get_pool = lambda: client.request("GET", pools(name="a"))  # noqa: E731
    started = time.monotonic()

    with KopfRunner(["run", "-A", "--standalone"], registry=kopf_operator, timeout=10) as runner:
        client.create(pools(), build_pool("a"))
        created = wait_until(lambda: (r := get_pool()).body.get("status", {}).get("phase") and r)
        client.patch(pools(name="a"), {"spec": {"model": {"name": "big"}}})
        updated = wait_until(
            lambda: (r := get_pool()).body["status"].get("observedGeneration") == 2 and r
        )
        client.delete(pools(name="a"))
        gone = wait_until(lambda: (r := get_pool()).status == 404 and r)

    assert runner.exit_code == 0
    assert created.body["status"]["phase"] == "tiny"
    assert created.body["metadata"]["finalizers"]  # kopf's own, which made the deletion wait
    assert updated.body["status"]["phase"] == "big"
    assert gone.status == 404
    assert (
        client.request("GET", resource_path("v1", "configmaps", "default", "deleted-a")).status
        == 200
    )
    # a watch that never ended would hold the runner until its 10 s server timeout
    assert time.monotonic() - started < 10


def test_kopf_operator_with_peering_announces_itself(
    kube_api: KubeApi, kopf_operator: kopf.OperatorRegistry
) -> None:
    for crd in kopf_peering_crds():
        kube_api.register_crd(crd)
    peerings = resource_path("kopf.dev/v1", "clusterkopfpeerings")
    kube_api.client.create(peerings, {"metadata": {"name": "kvpool"}})
    get_peering = lambda: kube_api.client.get(f"{peerings}/kvpool")  # noqa: E731
    get_pool = lambda: kube_api.client.request("GET", pools(name="a"))  # noqa: E731

    with KopfRunner(
        ["run", "-A", "--peering=kvpool"], registry=kopf_operator, timeout=10
    ) as runner:
        kube_api.client.create(pools(), build_pool("a"))
        served = wait_until(lambda: (r := get_pool()).body.get("status", {}).get("phase") and r)
        announced = wait_until(lambda: (p := get_peering()).get("status") and p)

    assert runner.exit_code == 0
    assert served.body["status"]["phase"] == "tiny"
    assert announced["status"]  # kopf's keep-alive entry for this operator


# --- proof 2: kubectl against the emulator -------------------------------------------------


@pytest.mark.usefixtures("kubectl_installed")
def test_kubectl_lists_our_kinds_with_their_printer_columns(kube_api: KubeApi) -> None:
    for crd in CRDS:
        kube_api.client.create(
            crd_path(crd), build_object(crd, f"one-{crd['spec']['names']['plural']}")
        )
    kube_api.client.create(pools("other"), build_pool("elsewhere"))
    kube_api.client.patch(
        pools(name="one-modelpools", sub="status"), {"status": {"phase": "Serving"}}
    )

    everything = kube_api.kubectl("get", "kvpool", "-A").stdout
    mine = kube_api.kubectl("get", "mp").stdout

    assert "NAMESPACE" in everything
    for crd in CRDS:
        columns = [
            c["name"].upper()
            for c in crd["spec"]["versions"][0].get("additionalPrinterColumns", [])
        ]
        assert all(c in everything for c in columns), (crd["metadata"]["name"], everything)
        assert f"one-{crd['spec']['names']['plural']}" in everything
    assert "elsewhere" in everything
    assert "elsewhere" not in mine
    pool_row = next(line for line in mine.splitlines() if line.startswith("one-modelpools"))
    assert "Serving" in pool_row


@pytest.mark.usefixtures("kubectl_installed")
def test_kubectl_watch_shows_changes_as_table_rows(kube_api: KubeApi) -> None:
    kube_api.client.create(pools(), build_pool("a"))

    def change_while_watching() -> None:
        wait_until(lambda: len(kube_api.emulator[kmock.action.WATCH]), 5, "kubectl watching")
        kube_api.client.patch(pools(name="a", sub="status"), {"status": {"phase": "Serving"}})

    changer = threading.Thread(target=change_while_watching)
    changer.start()
    try:
        watched = kube_api.kubectl("get", "mp", "--watch", "--request-timeout=1s").stdout
    finally:
        changer.join()

    rows = [line.split() for line in watched.splitlines()[1:]]
    assert [row[0] for row in rows] == ["a", "a"]
    assert "Serving" in rows[1]


@pytest.mark.usefixtures("kubectl_installed")
def test_kubectl_reads_and_deletes_one_object(kube_api: KubeApi) -> None:
    kube_api.client.create(pools(), build_pool("a"))

    shown = kube_api.kubectl("get", "mp", "a", "-o", "jsonpath={.spec.model.name}").stdout
    kube_api.kubectl("delete", "mp", "a")

    assert shown == "tiny"
    assert kube_api.client.request("GET", pools(name="a")).status == 404


@pytest.mark.usefixtures("kubectl_installed")
def test_kubectl_explain_describes_our_fields_from_the_crd_schemas(kube_api: KubeApi) -> None:
    # kubectl explain reads /openapi/v3 (it answered NotFound when none was served)
    spec = kube_api.kubectl("explain", "modelpools.spec").stdout
    limits = kube_api.kubectl("explain", "tb.spec.limits").stdout

    assert "KIND:       ModelPool" in spec and "VERSION:    v1alpha1" in spec
    assert "Desired state of a pool of warm vLLM replicas of one model." in spec
    assert "tierPolicyRef\t<Object> -required-" in spec
    assert "TierPolicy (same namespace) whose tiers share this pool." in spec
    assert "window\t<string> -required-" in limits, limits

    discovery = kube_api.client.request("GET", "/openapi/v3").body
    assert sorted(discovery["paths"]) == ["apis/kvpool.dev/v1alpha1"]
    unknown = kube_api.client.request("GET", "/openapi/v3/apis/nope.dev/v1")
    assert unknown.status == 404


def test_kube_api_env_lets_the_official_client_log_in(kube_api_env: KubeApi) -> None:
    from kubernetes import client, config

    # Pass the path: the client reads $KUBECONFIG once, when it is first imported.
    config.load_kube_config(config_file=os.environ["KUBECONFIG"])  # type: ignore[no-untyped-call]
    with client.ApiClient() as api:
        namespaces = client.CoreV1Api(api).list_namespace()
        created: Any = client.CustomObjectsApi(api).create_namespaced_custom_object(
            "kvpool.dev", "v1alpha1", "default", "modelpools", build_pool("a")
        )

    assert "default" in [ns.metadata.name for ns in namespaces.items if ns.metadata]
    assert created["metadata"]["uid"] == kube_api_env.client.get(pools(name="a"))["metadata"]["uid"]
