"""The operator's Kubernetes adapter against the API emulator: apply semantics and retries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from kvpool.adapters import kube
from kvpool.controller import apply
from kvpool.controller.leader import LeaderElector
from kvpool.domain import manifests as m
from tests.builders import modelpool_manifest, served_modelpool
from tests.support.kube import KubeApi
from tests.support.waiting import ManualClock


@pytest.fixture
async def client(kube_api: KubeApi) -> AsyncIterator[kube.KubeClient]:
    c = kube.KubeClient(kube.KubeConnection(server=kube_api.url), backoff=0.01)
    try:
        yield c
    finally:
        await c.close()


def _deployment(replicas: int = 2, **engine: Any) -> dict[str, Any]:
    return m.build_deployment(
        served_modelpool(modelpool_manifest("chat").engine(**engine)), "rev1", replicas, "stable"
    )


async def test_apply_creates_then_writes_only_what_changed(client: kube.KubeClient) -> None:
    created, action = await apply.apply_deployment(client, _deployment(nodeSelector={"gpu": "a"}))
    assert action == "created"
    version = created["metadata"]["resourceVersion"]

    same, action = await apply.apply_deployment(client, _deployment(nodeSelector={"gpu": "a"}))
    assert (action, same["metadata"]["resourceVersion"]) == ("unchanged", version)

    scaled, action = await apply.apply_deployment(client, _deployment(3, nodeSelector={"gpu": "a"}))
    assert (action, scaled["spec"]["replicas"]) == ("scaled", 3)

    # A foreign label survives; a field the spec no longer sets is removed (not merged)
    await client.merge_patch(
        kube.DEPLOYMENTS, "default", "chat-stable", {"metadata": {"labels": {"team": "x"}}}
    )
    updated, action = await apply.apply_deployment(client, _deployment(3))
    assert action == "updated"
    assert "nodeSelector" not in updated["spec"]["template"]["spec"]
    assert updated["metadata"]["labels"]["team"] == "x"
    assert updated["metadata"]["labels"]["kvpool.dev/pool"] == "chat"


async def test_a_conflict_on_create_becomes_an_update(
    kube_api: KubeApi, client: kube.KubeClient
) -> None:
    # Given an object created by a previous run, which this run did not see in its read
    await client.create(
        kube.SERVICES, "default", {"metadata": {"name": "chat-stable"}, "spec": {"ports": []}}
    )
    kube_api.emulator["get", kmock.resource("", "v1", "services")][:1] << 404

    service, action = await apply.apply_service(
        client, m.build_service(served_modelpool(modelpool_manifest("chat")), "stable")
    )

    assert action == "updated"
    assert service["spec"]["selector"] == {"kvpool.dev/pool": "chat", "kvpool.dev/track": "stable"}
    assert len(await client.list_objects(kube.SERVICES, "default")) == 1


@pytest.mark.parametrize(
    "status", [429, 500, 503], ids=["too-many-requests", "internal-error", "unavailable"]
)
async def test_transient_errors_are_retried(
    kube_api: KubeApi, client: kube.KubeClient, status: int
) -> None:
    kube_api.emulator["post", kmock.resource("apps", "v1", "deployments")][:2] << status
    _, action = await apply.apply_deployment(client, _deployment())
    assert action == "created"
    assert len(kube_api.emulator["post", kmock.resource("apps", "v1", "deployments")]) == 3


async def test_a_client_error_is_raised_not_retried(
    kube_api: KubeApi, client: kube.KubeClient
) -> None:
    kube_api.emulator["post", kmock.resource("apps", "v1", "deployments")] << 422
    with pytest.raises(kube.ApiError) as caught:
        await apply.apply_deployment(client, _deployment())
    assert caught.value.status == 422
    assert len(kube_api.emulator["post", kmock.resource("apps", "v1", "deployments")]) == 1


async def test_cleanup_deletes_only_the_pools_children(client: kube.KubeClient) -> None:
    pool, other = (
        served_modelpool(modelpool_manifest("chat")),
        served_modelpool(modelpool_manifest("other")),
    )
    for p in (pool, other):
        await apply.apply_deployment(client, m.build_deployment(p, "r", 1, "stable"))
        await apply.apply_service(client, m.build_service(p, "stable"))
        await apply.apply_pdb(client, m.build_pdb(p, 1))

    assert await kube.delete_children(client, "default", "chat") == 3

    for resource in kube.CHILD_RESOURCES:
        names = [o["metadata"]["name"] for o in await client.list_objects(resource, "default")]
        assert names and all(n.startswith("other") for n in names)


async def test_events_are_posted_about_the_object(client: kube.KubeClient) -> None:
    pool = {
        "apiVersion": "kvpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "chat", "namespace": "default", "uid": "u1"},
    }
    await kube.create_event(
        client, pool, "Warning", "CapacityShort", "needs 9 replicas", "2026-01-01T00:00:00Z"
    )
    [event] = await client.list_objects(kube.EVENTS, "default")
    assert (event["reason"], event["type"], event["involvedObject"]["uid"]) == (
        "CapacityShort",
        "Warning",
        "u1",
    )


async def test_a_closed_client_fails_fast_instead_of_retrying(kube_api: KubeApi) -> None:
    client = kube.KubeClient(kube.KubeConnection(server=kube_api.url), backoff=1.0)
    await client.get(kube.SERVICES, "default", "x")
    await client.close()  # the operator is stopping
    with pytest.raises(kube.ApiError, match="closed"):
        await client.get(kube.SERVICES, "default", "x")


async def test_leader_election_over_a_lease_with_an_injected_clock(
    client: kube.KubeClient, kube_api: KubeApi
) -> None:
    """Two electors, one clock: one leads; the other takes over only after expiry."""
    now = ManualClock(1000.0)
    started: list[str] = []

    def elector(identity: str) -> LeaderElector:
        async def on_started() -> None:
            started.append(identity)

        return LeaderElector(
            client, "default", "lease", identity, duration=15.0, clock=now,
            on_started=on_started,
        )  # fmt: skip

    a, b = elector("a"), elector("b")
    await a.step()
    await b.step()
    assert (a.leading, b.leading, started) == (True, False, ["a"])

    now.advance(14.0)  # a has not renewed for 14 s: still within its 15 s lease
    await b.step()
    assert not b.leading

    now.advance(2.0)  # 16 s: expired; a would not act any more either (renew deadline 10 s)
    await b.step()
    await a.step()
    lease = kube_api.client.get("/apis/coordination.k8s.io/v1/namespaces/default/leases/lease")
    assert (a.leading, b.leading, started) == (False, True, ["a", "b"])
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1

    await b.release()
    await a.step()
    assert a.leading and started == ["a", "b", "a"]


@pytest.mark.parametrize(
    ("status", "error"),
    [(409, kube.ConflictError), (404, kube.NotFoundError), (422, kube.ApiError)],
    ids=["conflict", "not-found", "invalid"],
)
async def test_error_answers_raise_their_type(
    kube_api: KubeApi, client: kube.KubeClient, status: int, error: type[kube.ApiError]
) -> None:
    kube_api.emulator["post", kmock.resource("", "v1", "services")] << status
    with pytest.raises(error) as caught:
        await client.create(kube.SERVICES, "default", {"metadata": {"name": "x"}})
    assert caught.value.status == status, f"HTTP {status} raised {caught.value!r}"


async def test_a_stale_finalizer_write_loses_the_race(client: kube.KubeClient) -> None:
    await client.create(kube.CONFIGMAPS, "default", {"metadata": {"name": "cm"}, "data": {}})
    stale = await client.get(kube.CONFIGMAPS, "default", "cm")
    assert stale is not None
    await client.merge_patch(kube.CONFIGMAPS, "default", "cm", {"data": {"a": "1"}})
    assert not await kube.set_finalizers(client, kube.CONFIGMAPS, stale, ["x"])
    fresh = await client.get(kube.CONFIGMAPS, "default", "cm")
    assert fresh is not None and await kube.set_finalizers(client, kube.CONFIGMAPS, fresh, ["x"])


async def test_a_leader_stops_at_its_renew_deadline_even_when_the_wall_clock_steps_back(
    kube_api: KubeApi,
) -> None:
    """The local renew deadline runs on the monotonic clock: a wall clock stepped back (NTP,
    a resumed VM) while renewals fail must not keep the old leader acting past it while a
    standby may take over."""
    client = kube.KubeClient(kube.KubeConnection(server=kube_api.url), attempts=1)
    clock = ManualClock(1000.0)
    elector = LeaderElector(client, "default", "lease", "a", duration=15.0, clock=clock)
    try:
        await elector.step()
        assert elector.leading
        leases = kmock.resource("coordination.k8s.io", "v1", "leases")
        kube_api.emulator["patch", leases] << 503  # every renewal fails from now on
        clock.advance(11.0)  # 11 s since the last renew: past the 10 s renew deadline...
        clock.step_wall(-30.0)  # ...while the wall clock was stepped back by 30 s
        await elector.step()
        assert not elector.leading, (
            f"still leading {clock.monotonic() - 1000.0:.0f} s after its last renew (renew "
            f"deadline {elector.renew_deadline:.0f} s), the wall clock stepped back 30 s"
        )
    finally:
        await client.close()
