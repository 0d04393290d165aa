"""The engine watcher forgets a replica's preemption count with the replica (issue 18.8),
and one of N replicas' polls cover N periods (the overcommit ratio creeps by time).

``_preemptions_seen`` (each replica's last ``vllm:num_preemptions_total``) was keyed by
replica URL and never pruned: a pool whose replicas come and go (autoscaling, rollouts:
new pod IPs each time) grew it by one entry per replica ever seen. Real Gateway object
and watcher; the engines' ``/metrics`` faked at the I/O boundary (the fetch function).
"""

from __future__ import annotations

import pytest

from kvpool.adapters.budget import InMemoryBudgetStore
from kvpool.adapters.engine_metrics import EngineLoad
from kvpool.gateway.server import Gateway
from kvpool.gateway.settings import GatewaySettings
from tests.builders import AdmissionConfigBuilder

REPLICAS = 4
ROLLOUTS = 25


def config(generation: int, pools: tuple[str, ...] = ("chat",)) -> AdmissionConfigBuilder:
    builder = AdmissionConfigBuilder().tier("batch", 50)
    for pool in pools:
        urls = [f"http://10.{generation}.{i}.1:8000" for i in range(REPLICAS)]
        builder.pool(pool, urls)
    return builder


async def test_preemption_counts_are_pruned_with_the_replicas() -> None:
    polled: list[str] = []

    async def fetch(url: str) -> EngineLoad:
        polled.append(url)
        return EngineLoad(kv_usage=0.1, running=1, waiting=0, preemptions_total=3)

    gateway = Gateway(
        config(0, ("chat", "code")).obj(),
        InMemoryBudgetStore(),
        settings=GatewaySettings(access_log=False),
    )
    gateway.watcher._fetch = fetch
    gateway._sync(gateway.index)
    for generation in range(1, ROLLOUTS + 1):  # every rollout: new pod IPs
        gateway.apply_config(config(generation, ("chat", "code")).obj())
        gateway._sync(gateway.index)
        for pool in ("chat", "code"):
            await gateway.watcher.poll_pool(pool)
    assert len(polled) == 2 * ROLLOUTS * REPLICAS
    seen = gateway.watcher._preemptions_seen
    remembered = sum(len(v) if isinstance(v, dict) else 1 for v in seen.values())
    assert remembered == 2 * REPLICAS, (
        f"the watcher remembers {remembered} replicas' preemption counts after "
        f"{ROLLOUTS} rollouts of 2 pools of {REPLICAS} replicas (live: {2 * REPLICAS})"
    )
    gateway.apply_config(config(ROLLOUTS, ("chat",)).obj())  # the pool code left
    gateway._sync(gateway.index)
    assert set(gateway.watcher._preemptions_seen) <= {"chat"}


async def test_a_poll_of_one_of_four_replicas_creeps_the_ratio_four_steps() -> None:
    """A replica with a quarter of the plan polls every 4 periods: each busy, quiet poll
    covers four of one replica's and lowers the overcommit ratio by four steps."""

    async def fetch(url: str) -> EngineLoad:
        return EngineLoad(kv_usage=0.9, running=4, waiting=0, preemptions_total=0)

    two_tiers = (
        AdmissionConfigBuilder()
        .tier("interactive", 50)
        .tier("batch", 30)
        .pool("chat", [f"http://10.0.{i}.1:8000" for i in range(REPLICAS)])
    )
    ratios = {}
    for share in (100, 25):
        gateway = Gateway(
            two_tiers.obj(),
            InMemoryBudgetStore(),
            settings=GatewaySettings(access_log=False, plan_share_percent=share),
        )
        gateway.watcher._fetch = fetch
        gateway._sync(gateway.index)
        for _ in range(5):
            await gateway.watcher.poll_pool("chat")
        ratios[share] = gateway.registry.adaptations["chat"].ratio_of("batch")
    assert gateway.watcher.periods_per_poll() == 4
    assert ratios == {100: pytest.approx(0.95), 25: pytest.approx(0.80)}
