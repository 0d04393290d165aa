"""What the gateway does with an upstream's result: eject, count, release, settle.

The engine is faked above the socket (:class:`tests.support.upstream.FakeUpstream`): each
test scripts how the call ended and checks the gateway's reaction - the answer the
client gets, outlier ejection, the upstream error metric, the reservation released, the
budget settled - through the real HTTP handler, pipeline, registry and admission. The
relay itself (streams over a socket, timeouts, headers) is tested against the fake engine
server (tests/integration/test_gateway_requests.py) and real vLLM engines.

Also here: the capacity seam. A :class:`~kvpool.gateway.capacity.CapacityShare` that
moves while requests are in flight is re-applied by ``registry.refresh_capacity`` at
once, with no new config, keeping the reservations in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.api.admission_config import (
    AdmissionConfig,
    CompiledPool,
    CompiledTenant,
    CompiledTier,
)
from kvpool.domain.partition import partition_pool
from kvpool.gateway.server import Gateway
from tests.builders import standard_admission_config
from tests.support.gateway import GatewayClientFactory
from tests.support.upstream import FakeAnswer, FakeUpstream
from tests.support.waiting import wait_until_async

ACME = {"Authorization": "Bearer sk-acme"}
NOWHERE = "http://127.0.0.1:9"  # no engine: the fake upstream answers
QUIET = {"health_probe_interval": 0, "engine_poll_seconds": 0}  # nothing to probe or poll
HOUR = 3600.0


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": [1] * 10, "max_tokens": 20, **extra}


def sample(gateway: Gateway, name: str, **labels: str) -> float | None:
    return gateway.metrics.registry.get_sample_value(name, labels)


def charged(gateway: Gateway) -> float | None:
    return sample(gateway, "kvpool_gateway_tenant_tokens_charged_total", tenant="acme", window="1h")


def budgeted() -> Any:
    return standard_admission_config([NOWHERE]).tenant(
        "acme", key="sk-acme", tiers=["interactive", "batch"], limits=[(HOUR, 100_000)]
    )


async def test_a_refused_replica_is_ejected_and_the_request_costs_nothing(
    gateway_client: GatewayClientFactory,
) -> None:
    upstream = FakeUpstream([FakeAnswer.refused()])
    client, gateway = await gateway_client(budgeted(), upstream=upstream, **QUIET)

    resp = await client.post("/v1/completions", json=completion(), headers=ACME)

    assert resp.status == 503, await resp.text()
    assert resp.headers["Retry-After"] == "1"
    assert sample(gateway, "kvpool_gateway_replica_ejected", pool="tiny", replica="tiny-0") == 1
    assert sample(gateway, "kvpool_gateway_ejections_total", pool="tiny", reason="refused") == 1
    assert sample(gateway, "kvpool_gateway_upstream_errors_total", pool="tiny", kind="connect") == 1
    snap = gateway.registry.runtimes["tiny"].snapshot()
    assert (snap.in_flight, snap.in_use_tokens) == (0, 0), "the reservation was not released"
    assert charged(gateway) == 0, "a request the engine never got was charged"


async def test_a_timed_out_replica_is_ejected_for_a_timeout(
    gateway_client: GatewayClientFactory,
) -> None:
    client, gateway = await gateway_client(
        budgeted(), upstream=FakeUpstream([FakeAnswer.timed_out()]), **QUIET
    )

    resp = await client.post("/v1/completions", json=completion(), headers=ACME)

    assert resp.status == 504
    assert sample(gateway, "kvpool_gateway_ejections_total", pool="tiny", reason="timeout") == 1
    assert sample(gateway, "kvpool_gateway_upstream_errors_total", pool="tiny", kind="timeout") == 1


async def test_the_engines_usage_settles_the_budget_and_the_body_carries_the_tier(
    gateway_client: GatewayClientFactory,
) -> None:
    upstream = FakeUpstream([FakeAnswer(prompt_tokens=10, completion_tokens=7)])
    client, gateway = await gateway_client(budgeted(), upstream=upstream, **QUIET)

    resp = await client.post("/v1/completions", json=completion(priority=-100), headers=ACME)

    assert resp.status == 200
    assert charged(gateway) == 17, "charged other than the engine's prompt + completion"
    (body,) = upstream.bodies()
    assert body["priority"] == 1, "the caller's priority reached the engine, not the tier's"
    assert body["max_tokens"] == 20


async def test_a_client_gone_while_the_engine_works_keeps_its_whole_reservation_charged(
    gateway_client: GatewayClientFactory,
) -> None:
    upstream = FakeUpstream(hold=asyncio.Event())
    client, gateway = await gateway_client(budgeted(), upstream=upstream, **QUIET)
    runtime = gateway.registry.runtimes["tiny"]
    request = asyncio.create_task(client.post("/v1/completions", json=completion(), headers=ACME))
    await wait_until_async(lambda: upstream.calls, 5, "the call at the engine")
    reserved = runtime.snapshot().in_use_tokens

    request.cancel()  # the client goes away; the handler is cancelled

    await wait_until_async(lambda: charged(gateway) is not None, 5, "the settlement")
    assert runtime.snapshot().in_flight == 0, "the reservation outlived its client"
    assert charged(gateway) == 30 == reserved, "the bound (10 + 20) stays charged"


@dataclass
class MovingShare:
    """A share that changes while the gateway runs (as a capacity lease would)."""

    percent: int = 100

    def pool_view(self, pool: CompiledPool, tiers: Sequence[CompiledTier]) -> CompiledPool:
        return partition_pool(pool, self.percent)

    def tenant_view(self, tenant: CompiledTenant, pool: str) -> CompiledTenant:
        return tenant

    def poll_period(self, seconds: float) -> float:
        return seconds

    def configure(self, config: AdmissionConfig) -> None:
        return None

    def attach(self, runtimes: Callable[[], Any], refresh: Callable[[str], None]) -> None:
        return None

    async def run(self) -> None:
        return None

    def unready_reason(self) -> str | None:
        return None

    async def leave(self) -> None:
        return None


async def test_a_moved_share_is_applied_at_once_keeping_the_reservations_in_flight(
    gateway_client: GatewayClientFactory,
) -> None:
    share = MovingShare(100)
    upstream = FakeUpstream(hold=asyncio.Event())
    config = standard_admission_config([NOWHERE], tokens_per_replica=4096, slots_per_replica=8)
    client, gateway = await gateway_client(config, upstream=upstream, capacity=share, **QUIET)
    runtime = gateway.registry.runtimes["tiny"]
    request = asyncio.create_task(client.post("/v1/completions", json=completion(), headers=ACME))
    await wait_until_async(lambda: upstream.calls, 5, "the call at the engine")

    share.percent = 50
    gateway.registry.refresh_capacity("tiny")

    assert gateway.registry.runtimes["tiny"] is runtime, "a new runtime lost the reservations"
    snap = runtime.snapshot()
    assert (runtime.pool.tokens_per_replica, runtime.pool.slots_per_replica) == (2048, 4)
    assert (snap.in_flight, snap.in_use_tokens) == (1, 30), "the reservation in flight was lost"
    assert upstream.hold is not None
    upstream.hold.set()
    assert (await request).status == 200
    assert runtime.snapshot().in_flight == 0
