"""Peering: with two operator replicas, only the active one (highest priority) acts.

kopf's peering (ClusterKopfPeering ``kvpool``) is what the Helm chart's two replicas rely
on. Tested minimally: a standby replica joins while an active one runs, and the standby
reconciles nothing (its own metrics show no reconcile) while the active one does.
Take-over after the active replica dies is kopf's (after the peering lifetime, 60 s by
default) and is not waited for here.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_operator import given_policy_tenant_and_pool, mp, pool_builder, status
from tests.operator_process import OperatorProcess
from tests.support.emulator import kopf_peering_crds
from tests.support.kube import KubeApi, resource_path
from tests.support.waiting import wait_until


def test_only_the_highest_priority_replica_acts(kube_api: KubeApi, tmp_path: Path) -> None:
    # Given the peering CRDs and object, and an active replica (priority 100)
    for crd in kopf_peering_crds():
        kube_api.register_crd(crd)
    peerings = resource_path("kopf.dev/v1", "clusterkopfpeerings")
    kube_api.client.create(peerings, {"metadata": {"name": "kvpool"}})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    active = OperatorProcess(
        kube_api, tmp_path / "a", extra_args=("--peering=kvpool", "--priority=100")
    )
    standby = OperatorProcess(
        kube_api, tmp_path / "b", extra_args=("--peering=kvpool", "--priority=10")
    )
    try:
        active.start()
        given_policy_tenant_and_pool(kube_api)
        wait_until(lambda: status(kube_api).get("plan"), timeout=30)
        wait_until(lambda: len(kube_api.client.get(f"{peerings}/kvpool").get("status") or {}) == 1)

        # When a standby replica (priority 10) joins and another pool appears
        standby.start()
        wait_until(lambda: len(kube_api.client.get(f"{peerings}/kvpool").get("status") or {}) == 2)
        kube_api.client.create(mp(), pool_builder("second").dict())

        # Then the active replica plans it and the standby does nothing, even after two
        # timer intervals (1 s) in which an active replica would re-plan every pool
        wait_until(lambda: status(kube_api, "second").get("plan"), timeout=30)
        ticks = active.reconciles()
        wait_until(lambda: active.reconciles() >= ticks + 2, 10, "two timer re-plans, active")
        assert standby.reconciles() == 0
    finally:
        standby.stop()
        active.stop()
