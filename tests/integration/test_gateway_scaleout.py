"""Gateway replicas admit as one: real ``kvpool gateway`` processes, a real Redis, and an
engine that holds its answers until the test lets them go (so what is in flight is known).

Given one engine of 8 slots and the plan of tests/builders (interactive 50 %, batch 30 %),
each case is a failure mode of issue 15: skewed ingress, a tier whose requests reach the
other replica, a replica that joins, one SIGKILLed, Redis stopped and restarted, and a
replica stopped (SIGSTOP) past its lease TTL. The engine's own count of requests in flight
is the witness: the replicas together never put more on it than the plan (8), and never
leave it idle while one of them has requests waiting.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpool.domain.lease.peaks import PEAK_WINDOW_SECONDS
from tests.builders import AdmissionConfigBuilder
from tests.support.gateway import FakeEngine, GatewayProcess, GatewayProcesses
from tests.support.redis_server import RedisFactory, RedisServer
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.redis

SLOTS = 8  # the engine's slots: the plan's total
TTL = 3.0  # --lease-ttl: a replica's capacity goes back to the others this long after it
LEASE_ARGS = ("--lease-period", "0.1", "--lease-ttl", str(TTL), "--engine-poll-seconds", "0")


def config(engine: FakeEngine) -> AdmissionConfigBuilder:
    return (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=30.0, reclaim="Preempt")
        .tier("batch", floor=30, lend=50, wait=30.0)
        .rule("interactive", path_prefix="/v1/chat", labels={"class": "interactive"})
        .pool("tiny", [engine.url], tokens_per_replica=8192, slots_per_replica=SLOTS)
        .tenant("acme", key="sk-acme", tiers=["interactive"], labels={"class": "interactive"})
        .tenant("bulk", key="sk-bulk", tiers=["batch"])
        .tenant(
            "capped",
            key="sk-capped",
            tiers=["interactive"],
            labels={"class": "interactive"},
            max_concurrency=4,
        )
    )


@dataclass
class Traffic:
    """Requests sent through the gateways, each a task, ended at teardown; ``written``
    counts those whose body went out on a socket (into a stopped gateway's accept backlog,
    say), seen by :meth:`trace` (hand it to the session)."""

    session: aiohttp.ClientSession = field(init=False)
    tasks: list[asyncio.Task[int]] = field(default_factory=list)
    written: int = 0

    def trace(self) -> aiohttp.TraceConfig:
        trace = aiohttp.TraceConfig()

        async def body_sent(_: object, request: SimpleNamespace, __: object) -> None:
            if not getattr(request, "written", False):  # once a request, however chunked
                request.written = True
                self.written += 1

        trace.on_request_chunk_sent.append(body_sent)
        return trace

    def batch(self, gateway: GatewayProcess, count: int) -> list[asyncio.Task[int]]:
        return self._send(gateway, count, "sk-bulk", "/v1/completions")

    def chat(self, gateway: GatewayProcess, count: int) -> list[asyncio.Task[int]]:
        return self._send(gateway, count, "sk-acme", "/v1/chat/completions")

    def capped_chat(self, gateway: GatewayProcess, count: int) -> list[asyncio.Task[int]]:
        return self._send(gateway, count, "sk-capped", "/v1/chat/completions")

    def _send(self, gateway: GatewayProcess, count: int, key: str, path: str):
        body: dict[str, object] = {"model": "tiny", "max_tokens": 4}
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": "hi"}]
        else:
            body["prompt"] = "hello"

        async def one() -> int:
            async with self.session.post(
                gateway.url + path, json=body, headers={"Authorization": f"Bearer {key}"}
            ) as response:
                await response.read()
                return response.status

        started = [asyncio.create_task(one()) for _ in range(count)]
        self.tasks.extend(started)
        return started


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    held = FakeEngine(hold=asyncio.Event())
    await held.start()
    yield held
    assert held.hold is not None
    held.hold.set()
    await held.stop()


@pytest.fixture
async def traffic() -> AsyncIterator[Traffic]:
    timeout = aiohttp.ClientTimeout(total=120)
    sent = Traffic()
    async with aiohttp.ClientSession(timeout=timeout, trace_configs=[sent.trace()]) as session:
        sent.session = session
        yield sent
        for task in sent.tasks:
            task.cancel()
        await asyncio.gather(*sent.tasks, return_exceptions=True)


@pytest.fixture
def redis(redis_server: RedisFactory) -> RedisServer:
    return redis_server()


@pytest.fixture
def replicas(
    gateway_process: GatewayProcesses, engine: FakeEngine, redis: RedisServer
) -> Callable[..., asyncio.Future[GatewayProcess]]:
    """``await replicas()``: one more gateway replica leasing capacity in the test's Redis."""
    builder = config(engine)

    def start(*extra: str) -> asyncio.Future[GatewayProcess]:
        return asyncio.ensure_future(
            gateway_process.started(builder, redis_url=redis.url, extra_args=LEASE_ARGS + extra)
        )

    return start


async def metric(gateway: GatewayProcess, name: str, **labels: str) -> float | None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(gateway.metrics_url) as response,
    ):
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def both_members(*gateways: GatewayProcess) -> None:
    """Wait until every replica has seen all of them at a renewal."""
    for gateway in gateways:
        await wait_until_async(
            lambda g=gateway: _is(metric(g, "kvpool_gateway_lease_members"), len(gateways)),
            10,
            f"{gateway.url} sees {len(gateways)} replicas",
        )


async def renewals_after(gateway: GatewayProcess, count: int, result: str = "ok") -> None:
    """Wait until ``gateway`` has made ``count`` more renewals with ``result`` (evidence
    that it renewed, instead of a guessed sleep)."""
    name = "kvpool_gateway_lease_renewals_total"
    start = await metric(gateway, name, result=result) or 0.0
    await wait_until_async(
        lambda: _above(metric(gateway, name, result=result), start + count - 1),
        10,
        f"{count} more {result} renewals of {gateway.url}",
    )


async def in_flight_reaches(engine: FakeEngine, count: int, timeout: float, what: str) -> float:
    """Seconds until the engine has ``count`` requests in flight."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    await wait_until_async(lambda: engine.in_flight >= count, timeout, what, interval=0.01)
    return loop.time() - start


async def a_full_and_b_waiting(
    replicas, engine: FakeEngine, traffic: Traffic, *a_args: str
) -> GatewayProcess:
    """Two replicas: a (started with ``a_args``, returned) holds the whole engine with
    batch, and 4 batch requests wait at b."""
    a, b = await replicas(*a_args), await replicas()
    traffic.batch(a, SLOTS)
    await in_flight_reaches(engine, SLOTS, 10, "a fills the engine")
    traffic.batch(b, 4)
    await wait_until_async(
        lambda: _above(metric(b, "kvpool_gateway_queued_requests", tier="batch"), 3),
        10,
        "b's 4 requests wait",
    )
    assert engine.in_flight == SLOTS
    return a


async def readyz(gateway: GatewayProcess) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(gateway.url + "/readyz") as response,
    ):
        return response.status, (await response.json())["status"]


async def test_on_a_fresh_redis_a_replica_is_ready_once_it_may_grow(
    gateway_process: GatewayProcesses, engine: FakeEngine, redis: RedisServer, traffic: Traffic
) -> None:
    """Given a Redis that has just started (no claims known: leases grow nothing for one
    member TTL), when a replica starts, then /readyz says why it cannot admit yet (503,
    naming the warm-up) and turns 200 within the TTL, when it admits at once; a later
    Redis restart leaves it ready (it keeps admitting on the claims it holds). Before: a
    replica answered 200 while it could start nothing, so requests sent to a freshly
    started gateway with a 0.25 s timeout never reached the engine."""
    gateway = gateway_process.create(config(engine), redis_url=redis.url, extra_args=LEASE_ARGS)
    loop = asyncio.get_running_loop()
    started = loop.time()
    gateway.process.start()
    statuses: list[int] = []

    async def answered() -> bool:
        try:
            status, reason = await readyz(gateway)
        except aiohttp.ClientError:
            return False
        statuses.append(status)
        assert status == 200 or "Redis has just started" in reason, reason
        return status == 200

    await wait_until_async(answered, TTL + 10, "the replica ready after the warm-up")
    seconds = loop.time() - started
    assert 503 in statuses, f"ready at once on a fresh Redis: {statuses[:5]}"
    traffic.batch(gateway, 2)
    await in_flight_reaches(engine, 2, 2, "requests start as soon as the replica is ready")
    renewed = await metric(gateway, "kvpool_gateway_lease_renewals_total", result="ok") or 0
    redis.kill()
    redis.start()
    await wait_until_async(
        lambda: _above(
            metric(gateway, "kvpool_gateway_lease_renewals_total", result="ok"), renewed + 3
        ),
        TTL + 5,
        "renewals on the restarted Redis",
    )
    status, reason = await readyz(gateway)
    assert status == 200, f"a Redis restart made a serving replica unready: {reason}"
    print(f"fresh Redis: ready after {seconds:.2f} s (member TTL {TTL} s)")


async def test_skewed_ingress_fills_the_engine_as_one_replica_would(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given two replicas (no --plan-share), when every batch request reaches replica a,
    then a admits the whole plan (a static 50 % share admitted 4 of the 8 slots), and the
    engine never gets more than the plan."""
    a, b = await replicas(), await replicas()
    await both_members(a, b)
    traffic.batch(a, 2 * SLOTS)
    seconds = await in_flight_reaches(engine, SLOTS, 10, "the engine full through one replica")
    assert engine.max_in_flight == SLOTS, f"over the plan: {engine.max_in_flight} in flight"
    print(f"skew: {SLOTS} slots in flight through one replica after {seconds:.2f} s")
    assert await metric(b, "kvpool_gateway_lease_members") == 2


async def test_a_floor_lent_to_another_replica_has_one_borrower(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given b holds the interactive floor (4 slots, Preempt) with one chat in flight and
    a's batch runs on the rest of it (a loan of b's idle floor, booked on both), when
    batch arrives at b too, then b's batch does not start on the floor it lent: the
    engine holds the plan, as on one replica, where a piece of idle floor has one
    borrower. Before: b's batch borrowed the same piece at home (its own queue took it in
    the next allocation, while a's requests in flight kept the loan): 11 on this 8-slot
    engine (docs/0008, "A lent floor with two borrowers")."""
    a, b = await replicas(), await replicas()
    await both_members(a, b)
    traffic.chat(b, 1)
    await in_flight_reaches(engine, 1, 10, "b's chat on the engine")
    traffic.batch(a, 2 * SLOTS)
    await in_flight_reaches(engine, SLOTS, 10, "a's batch fills the rest, on b's lent floor")
    await renewals_after(b, 3)  # b has seen a's loan in its table
    traffic.batch(b, SLOTS)
    await renewals_after(b, 10)  # b has had time to admit what it may
    await renewals_after(a, 3)
    assert engine.in_flight == SLOTS, f"{engine.in_flight} on the engine (plan: {SLOTS})"
    assert engine.max_in_flight == SLOTS, f"over the plan: {engine.max_in_flight} at most"


async def test_a_tier_arriving_at_the_other_replica_gets_its_floor_there(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given a holds the whole engine with batch (borrowing interactive's idle floor),
    when chats arrive at b, then they start at once (reclaim Preempt: the engine, not the
    gateway, makes room), without waiting for a's batch to end."""
    a, b = await replicas(), await replicas()
    traffic.batch(a, 2 * SLOTS)
    await in_flight_reaches(engine, SLOTS, 10, "a's batch fills the engine")
    traffic.chat(b, 2)
    seconds = await in_flight_reaches(engine, SLOTS + 2, 5, "b's chats reach the engine")
    interactive = [r for r in engine.received if r.get("priority") == 0]
    assert len(interactive) == 2
    print(f"floor where its tier arrives: b's chats on the engine {seconds:.2f} s after sending")
    assert seconds < 2.0, f"chats waited {seconds:.2f} s for a's batch"


async def test_a_chat_sparser_than_the_peaks_window_starts_at_once_where_chats_come(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given chats reach b seldom (its last one longer ago than the peaks' window, within
    the presence window) while a's batch holds the whole engine, when b's next chat comes,
    then it starts at once, as on one replica: the floor chats do not use stays in parts
    where they came (lent to a's batch, booked on both). Before, it went to a with the
    borrowers, and b's chat waited for a to give a piece up: 0.12 s."""
    a, b = await replicas(), await replicas()
    await both_members(a, b)
    assert engine.hold is not None
    first = traffic.chat(b, 1)
    await in_flight_reaches(engine, 1, 10, "b's first chat on the engine")
    await renewals_after(b, 2)  # b has reported it
    engine.hold.set()
    assert await asyncio.gather(*first) == [200]
    engine.hold.clear()
    traffic.batch(a, 2 * SLOTS)
    await in_flight_reaches(engine, SLOTS, 10, "a's batch fills the engine")
    await asyncio.sleep(PEAK_WINDOW_SECONDS + 1)  # b's chat is past the peaks' window
    traffic.chat(b, 1)
    seconds = await in_flight_reaches(engine, SLOTS + 1, 5, "b's chat on the engine")
    print(f"sparse chats: b's next chat on the engine {seconds:.3f} s after sending")
    queued = {"tier": "interactive", "le": "0.005"}
    assert await metric(b, "kvpool_gateway_queue_seconds_bucket", **queued) == 2


async def test_a_replica_that_joins_gets_capacity_only_as_it_is_released(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given a alone holds the whole engine, when b joins and gets batch requests, then none
    of b's starts while a's hold the plan (no capacity granted before it is released), and
    b's start as soon as a's end."""
    a = await replicas()
    traffic.batch(a, SLOTS)
    await in_flight_reaches(engine, SLOTS, 10, "a fills the engine")
    b = await replicas()
    b_requests = traffic.batch(b, 4)
    await both_members(a, b)
    await renewals_after(b, 5)  # b renews five times and is granted nothing
    assert engine.in_flight == SLOTS and engine.max_in_flight == SLOTS
    assert engine.hold is not None
    engine.hold.set()  # a's requests end (and b's, once they start)
    statuses = await asyncio.wait_for(asyncio.gather(*b_requests), 15)
    assert statuses == [200] * 4
    assert engine.max_in_flight == SLOTS, f"over the plan: {engine.max_in_flight}"


async def test_a_replica_that_joins_stands_by_for_a_tier_arriving_elsewhere_for_a_while(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given chats arrive at a, when b joins, then b holds a standby for a chat before its
    first one arrives (it cannot know yet whether the balancer sends it chats), so that
    first chat starts without waiting for a to give up a floor piece (the presumption ends
    after a few seconds: tests/unit/test_lease_plans.py). Before: b held no interactive
    capacity until its first chat arrived, which then waited two renewals (a's shrink,
    then b's grant): 50-150 ms in bench/scaleout.py."""
    a = await replicas()
    traffic.chat(a, 1)
    await in_flight_reaches(engine, 1, 10, "a's chat on the engine")
    b = await replicas()
    await both_members(a, b)
    standby = "kvpool_gateway_lease_capacity"
    labels = {"pool": "tiny", "tier": "interactive", "kind": "standby", "dimension": "slots"}
    await wait_until_async(
        lambda: _is(metric(b, standby, **labels), 1), 3, "b stands by for one chat"
    )
    traffic.chat(b, 1)
    seconds = await in_flight_reaches(engine, 2, 5, "b's first chat on the engine")
    print(f"join: b's first chat on the engine {seconds:.3f} s after sending")
    assert await metric(b, "kvpool_gateway_queue_seconds_count", tier="interactive") == 1
    assert (
        await metric(b, "kvpool_gateway_queue_seconds_bucket", tier="interactive", le="0.005") == 1
    )


async def test_a_killed_replica_gives_its_capacity_back_within_its_ttl(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    a = await a_full_and_b_waiting(replicas, engine, traffic)
    loop = asyncio.get_running_loop()
    killed = loop.time()
    os.kill(a.process.pid, signal.SIGKILL)  # its connections drop: the engine aborts them
    await wait_until_async(lambda: engine.in_flight == 0 or len(engine.received) > SLOTS, 5)
    await wait_until_async(lambda: len(engine.received) >= SLOTS + 4, TTL + 3, "b takes over")
    recovered = loop.time() - killed
    print(f"SIGKILL: b's requests on the engine {recovered:.2f} s after a was killed")
    assert recovered <= TTL + 1.0, f"took {recovered:.2f} s (member TTL {TTL} s)"


async def test_a_replica_that_stops_gives_its_capacity_back_at_once(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given a holds the whole engine and b's requests wait, when a is stopped (SIGTERM, as
    a rolling update or a scale-down does) and its requests are cut at its shutdown
    timeout, then b's requests start as soon as a has exited, not a member TTL later: a
    replica that stops deletes its claims and nudges. Before: b waited for a's claims to
    expire, as for a SIGKILLed replica (up to the TTL, 3 s)."""
    a = await a_full_and_b_waiting(replicas, engine, traffic, "--shutdown-timeout", "0.5")
    assert a.process.proc is not None
    a.process.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(a.process.proc.wait, 10) == 0
    loop = asyncio.get_running_loop()
    exited = loop.time()
    await wait_until_async(lambda: len(engine.received) >= SLOTS + 4, TTL + 3, "b takes over")
    seconds = loop.time() - exited
    print(f"SIGTERM: b's requests on the engine {seconds:.2f} s after a exited")
    assert seconds < TTL / 3, f"took {seconds:.2f} s: a's claims expired, not given back"


async def test_a_replica_that_stops_while_redis_is_down_says_so_and_exits(
    replicas, redis: RedisServer
) -> None:
    """Given Redis is down, when a replica is stopped (SIGTERM), it still exits cleanly and
    promptly, and its log says its capacity could not be given back and when the others
    take it (its claims expire): the degraded path is explicit, never a traceback."""
    a, b = await replicas("--shutdown-timeout", "0.5"), await replicas()
    await both_members(a, b)
    redis.kill()
    await renewals_after(a, 1, result="error")
    assert a.process.proc is not None
    loop = asyncio.get_running_loop()
    signalled = loop.time()
    a.process.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(a.process.proc.wait, 10) == 0
    seconds = loop.time() - signalled
    log = a.process.log_path.read_text()
    assert "could not give this replica's capacity back" in log, log[-2000:]
    assert "Traceback" not in log, log[-4000:]
    assert seconds < 5, f"took {seconds:.2f} s to exit with Redis down"


async def test_redis_down_keeps_admitting_on_the_equal_split_then_leases_again(
    replicas, engine: FakeEngine, traffic: Traffic, redis: RedisServer
) -> None:
    a, b = await replicas(), await replicas()
    await both_members(a, b)
    redis.kill()
    for gateway in (a, b):
        await wait_until_async(
            lambda g=gateway: _is(metric(g, "kvpool_gateway_lease_mode", mode="equal"), 1),
            TTL + 5,
            "the equal split while Redis is down",
        )
    traffic.batch(a, 2 * SLOTS)
    # fail-static: a admits its equal half of the plan, never the whole plan
    await in_flight_reaches(engine, SLOTS // 2, 10, "a admits on its equal split")
    await renewals_after(a, 5, result="error")  # a keeps trying; Redis still down
    assert engine.in_flight == SLOTS // 2, f"{engine.in_flight} in flight with Redis down"
    redis.start()
    await wait_until_async(
        lambda: _is(metric(a, "kvpool_gateway_lease_mode", mode="leased"), 1),
        TTL + 5,
        "leases again once Redis answers (after its warm-up)",
    )
    await in_flight_reaches(engine, SLOTS, TTL + 5, "a leases the whole plan again")
    assert engine.max_in_flight == SLOTS


async def test_a_limited_tenant_idle_when_redis_dies_is_served_on_the_last_lease(
    replicas, engine: FakeEngine, traffic: Traffic, redis: RedisServer
) -> None:
    """A tenant with a maxConcurrency is leased only where it has requests. Given it never
    sent one here, when Redis dies, its first chat starts while the last lease is still
    valid (on its equal part of the limit), not only once that lease runs out (2.5 s:
    longer than the examples' interactive queue wait)."""
    a = await replicas()
    await both_members(a)
    redis.kill()
    await renewals_after(a, 1, result="error")
    loop = asyncio.get_running_loop()
    sent = loop.time()
    (answer,) = traffic.capped_chat(a, 1)
    await in_flight_reaches(engine, 1, TTL + 5, "the idle tenant's chat on the engine")
    started = loop.time() - sent
    leased = await metric(a, "kvpool_gateway_lease_mode", mode="leased")
    print(f"the idle tenant's chat on the engine {started:.2f} s after it was sent")
    assert leased == 1.0, f"started {started:.2f} s later, once the last lease ran out"
    assert engine.hold is not None
    engine.hold.set()
    assert await asyncio.wait_for(answer, 15) == 200


async def test_a_replica_stopped_past_its_lease_does_not_admit_on_it_when_it_resumes(
    replicas, engine: FakeEngine, traffic: Traffic
) -> None:
    """Given a is the only busy replica (its lease is the whole plan, half of it in use),
    when a is SIGSTOPped longer than the member TTL, b is granted what a does not hold in
    flight; new requests reach a while it is stopped; then on SIGCONT a starts none of
    them on its old lease (which still had room), only what a renewal grants it."""
    a, b = await replicas(), await replicas()
    await both_members(a, b)
    half = SLOTS // 2
    traffic.batch(a, half)
    await in_flight_reaches(engine, half, 10, "a's requests on the engine")
    os.kill(a.process.pid, signal.SIGSTOP)
    try:
        traffic.batch(b, half)
        await wait_until_async(
            lambda: len(engine.received) >= SLOTS, TTL + 3, "b granted what a does not hold"
        )
        written = traffic.written
        late = traffic.batch(a, 3)  # in a's accept backlog while it is stopped
        await wait_until_async(
            lambda: traffic.written >= written + 3, 10, "3 requests written to the stopped a"
        )
    finally:
        os.kill(a.process.pid, signal.SIGCONT)
    await renewals_after(a, 3)  # a resumed and renewed
    started = len(engine.received) - SLOTS
    assert started == 0, f"a started {started} request(s) on its expired lease"
    assert engine.max_in_flight == SLOTS
    assert engine.hold is not None
    engine.hold.set()
    assert await asyncio.wait_for(asyncio.gather(*late), 15) == [200] * 3


async def test_a_replica_stopped_past_its_lease_claims_only_what_runs_on_a_fresh_redis(
    replicas, engine: FakeEngine, traffic: Traffic, redis: RedisServer
) -> None:
    """Given a, alone, leases the whole plan with half of it in flight, is SIGSTOPped past
    its lease TTL while b joins and is granted the other half, and Redis restarts empty
    meanwhile, when a resumes and renews first, then a claims only what its requests in
    flight hold, not its old lease: the warm-up grants a replica what it claims to hold,
    so a claimed expired lease put a's old room on the engine next to b's requests (found
    by the protocol's property test, tests/unit/test_lease_properties.py)."""
    a = await replicas()
    await both_members(a)
    half = SLOTS // 2
    traffic.batch(a, half)
    await in_flight_reaches(engine, half, 10, "a's requests on the engine")
    await wait_until_async(
        lambda: _is(
            metric(a, "kvpool_gateway_lease_capacity", kind="total", dimension="slots"), SLOTS
        ),
        5,
        "a, alone, leases the whole plan",
    )
    os.kill(a.process.pid, signal.SIGSTOP)
    try:
        b = await replicas()
        traffic.batch(b, half)
        await wait_until_async(
            lambda: len(engine.received) >= SLOTS, TTL + 5, "b granted what a does not hold"
        )
        written = traffic.written
        traffic.batch(a, 3)  # in a's accept backlog while it is stopped
        await wait_until_async(
            lambda: traffic.written >= written + 3, 10, "3 requests written to the stopped a"
        )
        os.kill(b.process.pid, signal.SIGSTOP)  # so that a renews first on the fresh Redis
        try:
            redis.kill()
            redis.start()
            os.kill(a.process.pid, signal.SIGCONT)
            await renewals_after(a, 3)
        finally:
            os.kill(b.process.pid, signal.SIGCONT)
    finally:
        os.kill(a.process.pid, signal.SIGCONT)  # harmless if it runs already
    await renewals_after(b, 3)
    started = len(engine.received) - SLOTS
    assert started == 0, f"a started {started} request(s) on its expired lease"
    assert engine.max_in_flight == SLOTS


async def _is(value: object, expected: float) -> bool:
    got = await value  # type: ignore[misc]
    return got == expected


async def _above(value: object, floor: float) -> bool:
    got = await value  # type: ignore[misc]
    return got is not None and got > floor
