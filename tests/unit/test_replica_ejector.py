"""The gateway's ejection gauge follows the config: a replica that left it is forgotten.

KvpoolReplicaEjected alerts on ``kvpool_gateway_replica_ejected == 1`` for 10 minutes; a
deleted engine pod ejected when it died must not keep that series at 1 for the gateway's
life (the alert would never resolve).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kvpool.gateway.ejection import ReplicaEjector
from kvpool.gateway.metrics import GatewayMetrics


class FakeRuntime:
    """What the ejector uses of a PoolRuntime: the pool's endpoints, and the ejection calls
    (recorded: the runtime keeps ejected replicas out of routing until told otherwise)."""

    def __init__(self, pool: str, *replicas: str) -> None:
        endpoints = [SimpleNamespace(name=r, url=f"http://{r}:8000", ready=True) for r in replicas]
        self.pool = SimpleNamespace(name=pool, tracks=[SimpleNamespace(endpoints=endpoints)])
        self.calls: list[tuple[str, bool]] = []

    def set_replica_ejected(self, name: str, ejected: bool) -> None:
        self.calls.append((name, ejected))


def runtime(pool: str, *replicas: str) -> Any:
    return FakeRuntime(pool, *replicas)


def ejected(metrics: GatewayMetrics, pool: str, replica: str) -> float | None:
    labels = {"pool": pool, "replica": replica}
    return metrics.registry.get_sample_value("kvpool_gateway_replica_ejected", labels)


def test_a_replica_gone_from_the_config_loses_its_ejection_gauge() -> None:
    metrics = GatewayMetrics()
    runtimes = {"chat": runtime("chat", "chat-0", "chat-1")}
    ejector = ReplicaEjector(metrics, lambda: runtimes)

    async def chat_1_dies() -> None:  # an ejection reschedules in-flight deadlines: a loop
        ejector.success(runtimes["chat"], "chat-0")
        ejector.failure(runtimes["chat"], "chat-1", "refused")

    asyncio.run(chat_1_dies())
    assert (ejected(metrics, "chat", "chat-0"), ejected(metrics, "chat", "chat-1")) == (0, 1)

    ejector.forget_absent()  # nothing left the config
    assert ejected(metrics, "chat", "chat-1") == 1

    runtimes["chat"] = runtime("chat", "chat-0", "chat-2")  # chat-1's pod was replaced
    ejector.forget_absent()
    assert ejected(metrics, "chat", "chat-1") is None
    assert ejected(metrics, "chat", "chat-0") == 0
    # the pool no longer holds chat-1 out: listed again one day, it starts in routing
    assert runtimes["chat"].calls == [("chat-1", False)]

    runtimes.clear()  # the pool left the config
    ejector.forget_absent()
    assert ejected(metrics, "chat", "chat-0") is None
