"""The gateway in front of a REAL vLLM engine on CPU and a REAL Redis.

Given one engine (tiny model, 2 MiB of KV = 2048 tokens, 8 sequences, priority
scheduling) shared by the module, these tests check, through real HTTP:

- the pool's tokenizer counts prompts exactly as the engine does (chat template included);
- requests pass end to end, streaming and not, and the budget is settled with the usage
  the engine reported;
- two ``kvpool gateway`` PROCESSES sharing one Redis enforce one budget under a concurrent
  burst: what they let through overshoots the limit by at most one reservation;
- a stream sent ahead of its budget verdict and refused by it is aborted by the engine
  (two gateways on one Redis, one spending the budget the other still sees room in);
- Redis killed mid-test: the fail-open tier keeps serving from its local allowance, the
  fail-closed tier answers 503 at once, Redis errors are counted, and budgets go back to
  Redis once it is back;
- the engine killed mid-stream: clients get a clear error, then 503, and every
  reservation is released (this test runs last: it kills the module's engine).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvpool.adapters.budget import (
    FailoverBudgetStore,
    FailoverPolicy,
    RedisBudgetStore,
)
from kvpool.adapters.engine_metrics import EngineLoad, parse_engine_metrics
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.gateway.metrics import GatewayMetrics
from tests.builders import tiny_engine_admission_config
from tests.support.engine import VllmEngine
from tests.support.gateway import GatewayClientFactory, GatewayProcesses
from tests.support.redis_server import RedisFactory
from tests.support.waiting import ManualClock, wait_until_async

pytestmark = [pytest.mark.engine, pytest.mark.redis]

ACME = {"Authorization": "Bearer sk-acme"}


def completion(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": max_tokens, **extra}


def chat(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there, how are you?"},
        ],
        "max_tokens": max_tokens,
        **extra,
    }


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", completion()), ("/v1/chat/completions", chat())],
    ids=["completion", "chat-with-template"],
)
def test_tokenizer_counts_prompts_like_the_engine(
    tiny_engine: VllmEngine, tiny_tokenizer_json: Path, path: str, body: dict[str, Any]
) -> None:
    tokenizer = TokenizerCache().get(str(tiny_tokenizer_json))
    assert tokenizer is not None
    if "messages" in body:
        ours = tokenizer.count_chat(body["messages"])
    else:
        ours = tokenizer.count_prompt(body["prompt"])
    answer = tiny_engine.post_json(path, body)
    assert ours == answer["usage"]["prompt_tokens"]


def reference_engine_load(text: str) -> EngineLoad:
    """What a full exposition parser (``prometheus_client``'s) reads from the same text."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return EngineLoad(
        kv_usage=values.get("vllm:kv_cache_usage_perc", 0.0),
        running=int(values.get("vllm:num_requests_running", 0.0)),
        waiting=int(values.get("vllm:num_requests_waiting", 0.0)),
        preemptions_total=int(values.get("vllm:num_preemptions_total", 0.0)),
    )


async def test_the_gateway_reads_an_engine_load_as_a_full_parser_does(
    tiny_engine: VllmEngine,
) -> None:
    """The gateway scans a real engine's ``/metrics`` for four samples instead of parsing
    all ~50 KB; it must read what a full parser reads, also with requests in flight.

    The requests stream, and the readings are taken between each stream's first token and
    its end: the engine is then running them for certain (a non-streaming burst could be
    over before the first reading, which made this test miss the busy engine on CI)."""
    body = completion(max_tokens=400, ignore_eos=True, stream=True)
    readings: list[tuple[EngineLoad, EngineLoad]] = []
    async with aiohttp.ClientSession(tiny_engine.base_url) as session:
        streams = [await session.post("/v1/completions", json=body) for _ in range(4)]
        try:
            for stream in streams:
                assert stream.status == 200, await stream.text()
                await stream.content.readuntil(b"\n\n")  # its first token: it is running

            async def read_while_busy() -> bool:
                """One reading by both parsers; True once it shows the requests running."""
                text = await (await session.get("/metrics")).text()
                readings.append((parse_engine_metrics(text), reference_engine_load(text)))
                return bool(readings[-1][0].running and readings[-1][0].kv_usage)

            # 400 tokens a stream: seconds of running after their first tokens
            await wait_until_async(read_while_busy, 30, "the engine reporting them running")
            still_streaming = [not stream.content.is_eof() for stream in streams]
        finally:
            for stream in streams:
                stream.close()
    assert all(ours == reference for ours, reference in readings), readings
    last = readings[-1][0]
    assert last.running > 0 and last.kv_usage > 0, (last, len(readings))
    assert all(still_streaming), "a stream ended before the reading: the engine was not busy"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", completion()), ("/v1/chat/completions", chat())],
    ids=["completion", "chat"],
)
async def test_end_to_end_non_streaming_settles_the_real_usage(
    tiny_engine: VllmEngine,
    tiny_tokenizer_json: Path,
    gateway_client: GatewayClientFactory,
    path: str,
    body: dict[str, Any],
) -> None:
    config = tiny_engine_admission_config(
        tiny_engine.base_url, tiny_tokenizer_json, limits=[(60, 10_000)]
    ).obj()
    client, gateway = await gateway_client(config)
    resp = await client.post(path, json={**body, "priority": -5}, headers=ACME)
    assert resp.status == 200, await resp.text()
    usage = (await resp.json())["usage"]
    assert 1 <= usage["completion_tokens"] <= 8
    used = await gateway.store.usage("default/acme", config.tenants[0].limits, gateway.wall_clock())
    assert used[0].tokens == usage["prompt_tokens"] + usage["completion_tokens"]
    text = await (await client.get("/metrics")).text()
    assert 'kvpool_gateway_estimates_total{method="tokenizer",pool="tiny"} 1.0' in text
    snap = gateway.registry.runtimes["tiny"].snapshot()
    assert (snap.in_use_tokens, snap.in_flight) == (0, 0)


@pytest.mark.parametrize("caller_wants_usage", [False, True], ids=["plain", "include-usage"])
async def test_end_to_end_streaming(
    tiny_engine: VllmEngine,
    tiny_tokenizer_json: Path,
    gateway_client: GatewayClientFactory,
    caller_wants_usage: bool,
) -> None:
    config = tiny_engine_admission_config(
        tiny_engine.base_url, tiny_tokenizer_json, limits=[(60, 10_000)]
    ).obj()
    client, gateway = await gateway_client(config)
    body = chat(max_tokens=12, stream=True, ignore_eos=True)
    if caller_wants_usage:
        body["stream_options"] = {"include_usage": True}
    resp = await client.post("/v1/chat/completions", json=body, headers=ACME)
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = [e[6:] for e in (await resp.text()).split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks)
    usage_chunks = [c for c in chunks if c.get("usage")]
    assert bool(usage_chunks) == caller_wants_usage
    used = await gateway.store.usage("default/acme", config.tenants[0].limits, gateway.wall_clock())
    tokenizer = TokenizerCache().get(str(tiny_tokenizer_json))
    assert tokenizer is not None
    prompt = tokenizer.count_chat(body["messages"])
    assert prompt is not None
    assert used[0].tokens == prompt + 12  # settled with the engine's usage (ignore_eos)
    assert gateway.registry.runtimes["tiny"].snapshot().in_flight == 0


async def test_budget_across_two_gateway_processes_sharing_redis(
    tiny_engine: VllmEngine,
    tiny_tokenizer_json: Path,
    redis_server: RedisFactory,
    gateway_process: GatewayProcesses,
) -> None:
    """Given a 600-token budget, when 24 requests of ~44 tokens hit two gateways at once,
    then what is served overshoots the budget by at most one reservation."""
    limit, max_tokens = 600, 40
    redis = redis_server()
    config = tiny_engine_admission_config(
        tiny_engine.base_url, tiny_tokenizer_json, limits=[(60, limit)]
    )
    gateways = [
        gateway_process(config, redis_url=redis.url, extra_args=("--redis-timeout", "1.0"))
        for _ in range(2)
    ]
    async with aiohttp.ClientSession() as session:

        async def send(i: int) -> tuple[int, dict[str, Any]]:
            url = f"{gateways[i % 2].url}/v1/completions"
            body = completion(max_tokens=max_tokens, ignore_eos=True)
            async with session.post(url, json=body, headers=ACME) as resp:
                return resp.status, await resp.json()

        results = await asyncio.gather(*(send(i) for i in range(24)))
    served = [body["usage"] for status, body in results if status == 200]
    statuses = sorted(status for status, _ in results)
    assert set(statuses) <= {200, 429}, statuses
    assert 429 in statuses  # the budget did bite
    reservation = served[0]["prompt_tokens"] + max_tokens
    used = sum(u["prompt_tokens"] + u["completion_tokens"] for u in served)
    assert used <= limit + reservation
    assert len(served) >= limit // reservation  # and it was not starved either
    print(f"served {len(served)} of 24, {used} tokens of a {limit} budget")


async def engine_generated(engine: VllmEngine) -> float:
    """The engine's ``vllm:generation_tokens_total`` so far."""
    async with aiohttp.ClientSession() as session, session.get(engine.metrics_url) as resp:
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:generation_tokens":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("the engine publishes no vllm:generation_tokens_total")


async def test_a_stream_refused_after_it_went_ahead_is_aborted_by_the_engine(
    tiny_engine: VllmEngine,
    tiny_tokenizer_json: Path,
    redis_server: RedisFactory,
    gateway_client: GatewayClientFactory,
) -> None:
    """Given two gateways on one Redis and a 1,000-token budget, when B spends 650 of it
    while A's view of it is still young, then A's next stream (about 405 tokens) goes
    ahead to the engine, is refused by its verdict (429, as if it had waited) and the
    engine aborts it: of the 400 tokens it would have generated, it makes at most a few."""
    redis = redis_server()
    config = tiny_engine_admission_config(
        tiny_engine.base_url, tiny_tokenizer_json, limits=[(60, 1000)]
    ).obj()

    def store() -> FailoverBudgetStore:
        return FailoverBudgetStore(RedisBudgetStore(redis.url, timeout=1.0))

    client_a, gateway_a = await gateway_client(config, store())
    client_b, _ = await gateway_client(config, store())
    first = await client_a.post("/v1/completions", json=completion(stream=True), headers=ACME)
    assert first.status == 200 and (await first.text()).endswith("[DONE]\n\n")
    spend = completion(max_tokens=60, ignore_eos=True)  # B spends 650 at once, while A's
    statuses = await asyncio.gather(  # view of the budget is young (2 s)
        *(client_b.post("/v1/completions", json=spend, headers=ACME) for _ in range(10))
    )
    assert [resp.status for resp in statuses] == [200] * 10
    before = await engine_generated(tiny_engine)

    body = completion(max_tokens=400, ignore_eos=True, stream=True)
    resp = await client_a.post("/v1/completions", json=body, headers=ACME)

    assert resp.status == 429, await resp.text()
    assert (await resp.json())["error"]["code"] == "budget_exceeded"
    metrics = gateway_a.metrics.render().decode()
    assert 'kvpool_gateway_budget_overlap_total{result="refused"} 1.0' in metrics
    await asyncio.sleep(1.0)  # 400 tokens take seconds on CPU: an unaborted request runs on
    made = await engine_generated(tiny_engine) - before
    assert made < 40, f"the engine generated {made:.0f} tokens of the refused request"
    assert gateway_a.registry.runtimes["tiny"].snapshot().in_flight == 0


async def test_redis_killed_mid_test_follows_the_tier_policy(
    tiny_engine: VllmEngine,
    tiny_tokenizer_json: Path,
    redis_server: RedisFactory,
    gateway_client: GatewayClientFactory,
) -> None:
    redis = redis_server()
    metrics = GatewayMetrics()
    breaker_clock = ManualClock()  # the breaker stays open until the test moves it on
    store = FailoverBudgetStore(
        RedisBudgetStore(redis.url, timeout=0.05),
        FailoverPolicy(fail_closed_tiers=frozenset({"batch"}), failure_threshold=1),
        on_error=lambda op, exc: metrics.redis_errors.labels(op).inc(),
        on_fallback=lambda tier, result: metrics.budget_fallback.labels(tier, result).inc(),
        clock=breaker_clock,
    )
    config = tiny_engine_admission_config(
        tiny_engine.base_url, tiny_tokenizer_json, limits=[(60, 100_000)]
    ).obj()
    client, _ = await gateway_client(config, store, metrics=metrics)
    assert (await client.post("/v1/completions", json=completion(), headers=ACME)).status == 200

    redis.kill()
    chat_resp = await client.post("/v1/chat/completions", json=chat(), headers=ACME)
    assert chat_resp.status == 200  # interactive fails open: the local allowance serves it

    def reserve_errors() -> float | None:
        labels = {"op": "reserve"}
        return metrics.registry.get_sample_value("kvpool_gateway_redis_errors_total", labels)

    errors_before = reserve_errors()
    assert errors_before  # the chat's reserve failed and opened the breaker
    batch_resp = await client.post("/v1/completions", json=completion(), headers=ACME)
    assert batch_resp.status == 503  # batch fails closed
    assert (await batch_resp.json())["error"]["code"] == "budget_unavailable"
    assert "Retry-After" in batch_resp.headers
    # no waiting on a dead Redis: the breaker is open, so Redis was not even asked
    assert reserve_errors() == errors_before
    text = await (await client.get("/metrics")).text()
    assert 'kvpool_gateway_redis_errors_total{op="reserve"}' in text
    assert 'kvpool_gateway_budget_fallback_total{result="local",tier="interactive"}' in text
    assert 'kvpool_gateway_budget_fallback_total{result="reject",tier="batch"} 1.0' in text
    assert 'result="local",tier="batch"' not in text  # a fail-closed tier never counts local

    redis.start()  # same port, empty data
    breaker_clock.advance(store.policy.open_seconds)  # the breaker's retry interval passes
    again = await client.post("/v1/completions", json=completion(), headers=ACME)
    assert again.status == 200
    used = await store.usage("default/acme", config.tenants[0].limits, time.time())
    assert used[0].tokens > 0  # charged in Redis again


async def test_engine_killed_gives_clear_errors_and_releases_everything(
    tiny_engine: VllmEngine, tiny_tokenizer_json: Path, gateway_client: GatewayClientFactory
) -> None:
    """Runs last in the module: it kills the shared engine."""
    config = tiny_engine_admission_config(
        tiny_engine.base_url, tiny_tokenizer_json, limits=[(60, 100_000)]
    ).obj()
    client, gateway = await gateway_client(config)
    stream = await client.post(
        "/v1/completions",
        json=completion(max_tokens=400, ignore_eos=True, stream=True),
        headers=ACME,
    )
    assert stream.status == 200
    await stream.content.readline()  # the stream has started
    tiny_engine.process.kill()
    rest = (await stream.read()).decode()
    assert "engine_stream_broken" in rest
    after = await client.post("/v1/completions", json=completion(), headers=ACME)
    assert after.status == 503 and "Retry-After" in after.headers
    # refused by the dead engine, or already ejected by a failed health probe
    assert (await after.json())["error"]["code"] in ("engine_unavailable", "no_ready_replica")
    snap = gateway.registry.runtimes["tiny"].snapshot()
    assert (snap.in_use_tokens, snap.in_use_slots, snap.in_flight) == (0, 0, 0)
    used = await gateway.store.usage("default/acme", config.tenants[0].limits, gateway.wall_clock())
    assert used[0].tokens < 400  # settled with what was streamed, not the 400 reserved
