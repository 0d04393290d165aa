"""When a pool's runtime asks the lease keeper for an early renewal (``on_queued``): only
for a request that waits with nothing queued ahead of it in its tier or a higher one.
Under a flood every arrival queues behind others; waking the keeper for each of them
made replicas renew twice a period for nothing (the periodic renewal follows a queue
that stays long). The keeper is told the tier (a ``Preempt`` tier's wait hurries it)."""

from __future__ import annotations

import asyncio

from kvpool.domain.admission import AdmissionRequest, Admit
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pool_runtime import PoolRuntime
from tests.builders import CompiledPoolBuilder


def request(rid: str, tier: str, tokens: int = 100) -> AdmissionRequest:
    return AdmissionRequest(request_id=rid, tenant=f"t-{rid}", tier=tier, tokens=tokens)


def test_only_the_head_of_a_queue_wakes_the_keeper() -> None:
    async def scenario() -> list[tuple[str, str]]:
        builder = (
            CompiledPoolBuilder()
            .capacity(200, 2)
            .tier("interactive", 100, 1, wait=30)
            .tier("batch", 100, 1, wait=30)
            .replicas(1)
        )
        runtime = PoolRuntime(builder.obj(), builder.tiers(), GatewayMetrics())
        woken: list[tuple[str, str]] = []
        arrivals: list[str] = []
        runtime.on_queued = lambda tier: woken.append((arrivals[-1], tier))
        waiting: list[asyncio.Task[object]] = []

        async def offer(rid: str, tier: str) -> None:
            arrivals.append(rid)
            waiting.append(asyncio.create_task(runtime.admit(request(rid, tier))))
            await asyncio.sleep(0)  # the offer runs up to its queueing

        try:
            # both slots taken: every later request waits
            first = await runtime.admit(request("b0", "batch"))
            second = await runtime.admit(request("i0", "interactive"))
            assert isinstance(first, Admit) and isinstance(second, Admit)
            await offer("b1", "batch")  # the head of batch's queue: wakes
            await offer("b2", "batch")  # behind b1: does not
            await offer("b3", "batch")
            await offer("i1", "interactive")  # nothing queued ahead in its tier or above
            await offer("i2", "interactive")  # behind i1
            return woken
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            runtime.close()

    assert asyncio.run(scenario()) == [("b1", "batch"), ("i1", "interactive")]
