"""The gateway's replica ejector: what its health probes count, and its gauge.

- One ``/health`` probe answered late (a loaded machine) ejects nothing: an ejection ends
  every request in flight on the replica, so it takes two missed probes in a row; a refused
  connection ejects at once.
- KvpoolReplicaEjected alerts on ``kvpool_gateway_replica_ejected == 1`` for 10 minutes; a
  deleted engine pod ejected when it died must not keep that series at 1 for the gateway's
  life (the alert would never resolve).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kvpool.gateway.ejection import ReplicaEjector
from kvpool.gateway.metrics import GatewayMetrics
from tests.support.gateway import FakeEngine
from tests.support.ports import free_port
from tests.support.waiting import wait_until_async


class FakeRuntime:
    """What the ejector uses of a PoolRuntime: the pool's endpoints, and the ejection calls
    (recorded: the runtime keeps ejected replicas out of routing until told otherwise)."""

    def __init__(self, pool: str, *replicas: str, urls: dict[str, str] | None = None) -> None:
        endpoints = [
            SimpleNamespace(name=r, url=(urls or {}).get(r, f"http://{r}:8000"), ready=True)
            for r in replicas
        ]
        self.pool = SimpleNamespace(name=pool, tracks=[SimpleNamespace(endpoints=endpoints)])
        self.calls: list[tuple[str, bool]] = []

    def set_replica_ejected(self, name: str, ejected: bool) -> None:
        self.calls.append((name, ejected))


def runtime(pool: str, *replicas: str, urls: dict[str, str] | None = None) -> Any:
    return FakeRuntime(pool, *replicas, urls=urls)


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


def ejections(metrics: GatewayMetrics, pool: str, reason: str) -> float:
    labels = {"pool": pool, "reason": reason}
    return metrics.registry.get_sample_value("kvpool_gateway_ejections_total", labels) or 0.0


def test_one_late_probe_ejects_nothing_two_in_a_row_do_and_refused_at_once() -> None:
    metrics = GatewayMetrics()

    async def scenario() -> None:
        delays = [0.6, 0.0, 0.6, 0.0, 0.6]  # late (0.25 s timeout), on time, late, ...
        engine = await FakeEngine(health_delays=delays).start()
        closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused
        urls = {"late": engine.url, "gone": closed}
        runtimes = {"chat": runtime("chat", "late", "gone", urls=urls)}
        ejector = ReplicaEjector(metrics, lambda: runtimes, probe_interval=0.02, probe_timeout=0.25)
        ejector.start()
        try:
            # every late answer probed, then three on time: the last late probe has timed
            # out (a replica's probes run one after another) and the next ones succeeded
            await wait_until_async(lambda: not delays, 10, "every late /health answered")
            answered = engine.health_answers
            await wait_until_async(
                lambda: engine.health_answers >= answered + 3, 10, "three on-time probes more"
            )
            assert ejected(metrics, "chat", "late") == 0
            assert ejections(metrics, "chat", "health") == 0
            assert ejected(metrics, "chat", "gone") == 1
            assert ejections(metrics, "chat", "refused") >= 1

            delays.extend([0.6, 0.6])  # two late answers in a row: hung
            await wait_until_async(
                lambda: ejections(metrics, "chat", "health") == 1, 10, "the hung replica ejected"
            )
            assert ("late", True) in runtimes["chat"].calls
        finally:
            await ejector.stop()
            await engine.stop()

    asyncio.run(scenario())
