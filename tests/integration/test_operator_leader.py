"""One active operator: two replicas share a coordination.k8s.io/v1 Lease, one acts.

Given two ``kvpool operator`` processes (leader election on, a 3 s Lease), exactly one
holds the Lease and reconciles; the other keeps its cache warm and does nothing. When
the leader is killed (SIGKILL: no release), the other takes over within the Lease
duration and plans what was created meanwhile; a graceful stop releases the Lease, so
the hand-over takes about one retry.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.integration.test_operator import given_policy_tenant_and_pool, mp, pool_builder, status
from tests.operator_process import OperatorProcess
from tests.support.kube import KubeApi, resource_path
from tests.support.waiting import wait_until

LEASE = resource_path("coordination.k8s.io/v1", "leases", "default", "kvpool-operator")
DURATION = 3.0


def holder(kube: KubeApi) -> str | None:
    lease = kube.client.request("GET", LEASE)
    return lease.body["spec"].get("holderIdentity") if lease.status == 200 else None


def lease_time(kube: KubeApi, field: str) -> float:
    """A MicroTime of the Lease's spec (``renewTime``, ``acquireTime``) as epoch seconds:
    the replicas' own record of when they acted, free of this test's polling delays."""
    value: str = kube.client.get(LEASE)["spec"][field]
    return datetime.fromisoformat(value).timestamp()


def replica(kube: KubeApi, workdir: Path, name: str) -> OperatorProcess:
    (workdir / name).mkdir()
    return OperatorProcess(
        kube, workdir / name, identity=name, extra_args=(f"--lease-duration={DURATION:g}s",)
    )


def test_two_replicas_one_acts_and_the_other_takes_over(kube_api: KubeApi, tmp_path: Path) -> None:
    a, b = replica(kube_api, tmp_path, "a"), replica(kube_api, tmp_path, "b")
    try:
        # Given replica a leading and replica b started after it
        a.start()
        wait_until(lambda: holder(kube_api) == "a")
        b.start()
        given_policy_tenant_and_pool(kube_api)
        wait_until(lambda: status(kube_api).get("plan"))

        # Then only a acts, over two timer ticks (1 s) in which a leader re-plans
        ticks = a.reconciles()
        wait_until(lambda: a.reconciles() >= ticks + 2, 10, "two timer re-plans by the leader")
        assert b.reconciles() == 0
        assert "kvpool_operator_leader 1.0" in a.metrics()
        assert "kvpool_operator_leader 0.0" in b.metrics()
        assert holder(kube_api) == "a"

        # When a is killed (no release), b takes over once the Lease has expired, not before
        # (two leaders) and within one retry (0.6 s) after; a may renew once more (every
        # 0.6 s) between the read of its renewal and the kill
        renewed = lease_time(kube_api, "renewTime")
        a.process.kill()
        wait_until(lambda: holder(kube_api) == "b", timeout=DURATION * 3)
        took = lease_time(kube_api, "acquireTime") - renewed
        print(f"take-over {took:.2f}s after the last renewal read")
        # (the lower bound less 10 ms: the Lease's MicroTimes are truncated to microseconds)
        assert DURATION - 0.01 <= took <= DURATION + 0.6 + 0.6 + 0.5, f"take-over after {took:.2f}s"
        # and acts: a pool created now is planned by b
        kube_api.client.create(mp(), pool_builder("second").dict())
        wait_until(lambda: status(kube_api, "second").get("plan"))
        assert b.reconciles() >= 1

        # When a comes back it stands by; when b stops gracefully, a takes over at once
        a.start()
        ticks = b.reconciles()
        wait_until(lambda: b.reconciles() >= ticks + 1, 10, "a timer re-plan by b, a running")
        assert holder(kube_api) == "b" and a.reconciles() == 0
        renewed = lease_time(kube_api, "renewTime")
        b.stop()
        wait_until(lambda: holder(kube_api) == "a", timeout=DURATION * 3)
        # before b's last renewal could have expired: only a release lets a in that early
        took = lease_time(kube_api, "acquireTime") - renewed
        print(f"released Lease taken {took:.2f}s after b's last renewal read")
        assert took < DURATION, f"a released Lease was taken {took:.2f}s after b's renewal"
        wait_until(lambda: a.reconciles() >= 1)
    finally:
        b.stop()
        a.stop()
