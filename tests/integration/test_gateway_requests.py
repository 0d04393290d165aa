"""The gateway's request path over real HTTP, in front of a fake engine (fast, no vLLM).

The engine is faked at the I/O boundary (tests.support.gateway.FakeEngine records what
it receives); everything else - aiohttp server, classify, estimate, budgets, admission,
proxying, metrics - is the real code. The real-engine tests are in test_gateway_engine.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from kvpool.adapters.budget import (
    FailoverBudgetStore,
    FailoverPolicy,
    RedisBudgetStore,
)
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import AdmissionConfig
from kvpool.gateway.metrics import GatewayMetrics
from tests.builders import AdmissionConfigBuilder, standard_admission_config
from tests.support.gateway import FakeEngine, GatewayClientFactory
from tests.support.waiting import WaitTimeoutError, wait_until_async

ACME = {"Authorization": "Bearer sk-acme"}
BULK = {"Authorization": "Bearer sk-bulk"}


def chat(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}


def completion(prompt: Any = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, **extra}


def _forbidden_config(url: str) -> AdmissionConfigBuilder:
    return standard_admission_config([url]).tenant("chatonly", key="sk-chat", tiers=["interactive"])


REJECTIONS = {
    "no-key": ("/v1/completions", {}, completion(), 401, "invalid_api_key"),
    "unknown-key": (
        "/v1/completions",
        {"Authorization": "Bearer sk-nobody"},
        completion(),
        401,
        "invalid_api_key",
    ),
    "not-bearer": (
        "/v1/completions",
        {"Authorization": "Basic c2stYWNtZQ=="},
        completion(),
        401,
        "invalid_api_key",
    ),
    "unknown-model": ("/v1/completions", ACME, completion(model="gpt-9"), 404, "model_not_found"),
    "missing-model": ("/v1/completions", ACME, {"prompt": "x"}, 400, "missing_model"),
    "max-tokens-string": (
        "/v1/completions",
        ACME,
        completion(max_tokens="ten"),
        400,
        "invalid_type",
    ),
    "max-tokens-zero": ("/v1/completions", ACME, completion(max_tokens=0), 400, None),
    "max-tokens-over-the-context": (
        "/v1/completions",
        ACME,
        completion(prompt=[1, 2], max_tokens=513),
        400,
        "max_tokens_too_large",
    ),
    "prompt-fills-the-context": (
        "/v1/completions",
        ACME,
        completion(prompt=[1] * 512),
        400,
        "prompt_too_long",
    ),
    "empty-prompt-list": (
        "/v1/completions",
        ACME,
        completion(prompt=[]),
        400,
        "invalid_prompt",
    ),
    "chat-without-messages": ("/v1/chat/completions", ACME, {"model": "tiny"}, 400, None),
    "tier-not-allowed": (
        "/v1/completions",
        {"Authorization": "Bearer sk-chat"},
        completion(),
        403,
        "tier_not_allowed",
    ),
}


@pytest.mark.parametrize(
    ("path", "headers", "body", "status", "code"), list(REJECTIONS.values()), ids=list(REJECTIONS)
)
async def test_rejections_are_clear_json_errors(
    fake_engine: FakeEngine,
    gateway_client: GatewayClientFactory,
    path: str,
    headers: dict[str, str],
    body: dict[str, Any],
    status: int,
    code: str | None,
) -> None:
    client, _ = await gateway_client(_forbidden_config(fake_engine.url).obj())
    resp = await client.post(path, json=body, headers=headers)
    assert resp.status == status
    error = (await resp.json())["error"]
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    assert fake_engine.received == []  # nothing reached the engine


async def test_missing_and_unknown_keys_get_the_same_answer(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    client, _ = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    missing = await client.post("/v1/completions", json=completion())
    unknown = await client.post(
        "/v1/completions", json=completion(), headers={"Authorization": "Bearer sk-x"}
    )
    assert (missing.status, await missing.read()) == (unknown.status, await unknown.read())


async def test_oversized_body_is_413(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    client, _ = await gateway_client(
        standard_admission_config([fake_engine.url]).obj(), max_body_bytes=1000
    )
    resp = await client.post("/v1/completions", json=completion("x" * 5000), headers=ACME)
    assert resp.status == 413
    assert (await resp.json())["error"]["code"] == "body_too_large"


async def test_caller_priority_is_stripped_and_the_tier_sets_it(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    client, _ = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    headers = {**BULK, "X-Priority": "0", "Priority": "u=0", "X-Request-Priority": "high"}
    resp = await client.post(
        "/v1/completions", json=completion(priority=-1000, max_tokens=3), headers=headers
    )
    assert resp.status == 200
    assert fake_engine.received[0]["priority"] == 1  # batch is the second tier: engine priority 1
    sent = {k.lower() for k in fake_engine.headers[0]}
    assert not sent & {"x-priority", "priority", "x-request-priority", "authorization"}


# (path, body, upstream output field, value the engine must receive or None = untouched).
# maxModelLen 512; token-id prompts are counted exactly. The engine bounds each sequence's
# output by min(max_tokens, 512 - prompt); the gateway charges that and says it upstream.
ENGINE_RULES = {
    "max-tokens-past-the-context-is-served-and-bounded": (
        "/v1/completions",
        completion(prompt=[1] * 401, max_tokens=120),
        "max_tokens",
        111,
    ),
    "completions-without-max-tokens-keeps-the-default-16": (
        "/v1/completions",
        completion(prompt=[1, 2, 3]),
        "max_tokens",
        None,
    ),
    "completions-null-max-tokens-is-bounded-by-the-context": (
        "/v1/completions",
        completion(prompt=[1, 2, 3], max_tokens=None),
        "max_tokens",
        509,
    ),
    "chat-without-max-tokens-is-bounded-by-the-context": (
        "/v1/chat/completions",
        chat("hi"),
        "max_completion_tokens",
        "bounded",
    ),
    "list-of-prompts-is-served": (
        "/v1/completions",
        completion(prompt=[[1, 2, 3], [4, 5]], max_tokens=4),
        "max_tokens",
        None,
    ),
    "n-sequences-beyond-a-replica-are-served": (
        "/v1/completions",
        completion(prompt=[1, 2], n=9, max_tokens=2),
        "max_tokens",
        None,
    ),
    "max-tokens-within-the-context-is-untouched": (
        "/v1/completions",
        completion(prompt=[1] * 10, max_tokens=5),
        "max_tokens",
        None,
    ),
}


@pytest.mark.parametrize(
    ("path", "body", "field_name", "expected"),
    list(ENGINE_RULES.values()),
    ids=list(ENGINE_RULES),
)
async def test_the_engine_rules_serve_and_bound_the_output(
    fake_engine: FakeEngine,
    gateway_client: GatewayClientFactory,
    path: str,
    body: dict[str, Any],
    field_name: str,
    expected: int | str | None,
) -> None:
    client, gateway = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    resp = await client.post(path, json=body, headers=ACME)
    assert resp.status == 200, await resp.text()
    sent = fake_engine.received[0]
    if expected is None:
        assert sent.get(field_name) == body.get(field_name)
    elif expected == "bounded":
        assert isinstance(sent[field_name], int) and 400 < sent[field_name] < 512
    else:
        assert sent[field_name] == expected
    snap = gateway.registry.runtimes["tiny"].snapshot()
    assert (snap.in_use_tokens, snap.in_use_slots, snap.in_flight) == (0, 0, 0)


async def test_budget_is_charged_the_engine_bound_without_max_tokens(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """Issue 9.1: omitting max_tokens must not shrink the charge below what may be generated."""
    config = standard_admission_config([fake_engine.url]).tenant(
        "capped", key="sk-capped", tiers=["batch"], limits=[(60, 300)]
    )
    client, _ = await gateway_client(config.obj())
    capped = {"Authorization": "Bearer sk-capped"}
    bounded = await client.post(
        "/v1/completions", json=completion(prompt=[1] * 10, max_tokens=100), headers=capped
    )
    # no max_tokens: 10 + 502 = 512 may be generated, more than the whole 300-token budget
    unbounded = await client.post(
        "/v1/completions", json=completion(prompt=[1] * 10, max_tokens=None), headers=capped
    )
    assert bounded.status == 200, await bounded.text()
    assert unbounded.status == 429, await unbounded.text()
    assert len(fake_engine.received) == 1


async def test_upstream_body_is_json_whatever_the_caller_declared(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """``curl -d`` declares a form body; the engine must still be told it gets JSON."""
    client, _ = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    form_typed = {**ACME, "Content-Type": "application/x-www-form-urlencoded"}

    resp = await client.post(
        "/v1/completions", data=json.dumps(completion(max_tokens=2)), headers=form_typed
    )

    assert resp.status == 200
    assert fake_engine.headers[0]["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("path", "headers", "tier_priority"),
    [
        ("/v1/chat/completions", ACME, 0),
        ("/v1/completions", ACME, 1),
        ("/v1/chat/completions", BULK, 1),
    ],
    ids=["chat-interactive", "completions-fall-to-lowest", "unlabelled-tenant-on-chat"],
)
async def test_tier_comes_from_path_and_tenant(
    fake_engine: FakeEngine,
    gateway_client: GatewayClientFactory,
    path: str,
    headers: dict[str, str],
    tier_priority: int,
) -> None:
    client, _ = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    body = chat(max_tokens=2) if path.endswith("chat/completions") else completion(max_tokens=2)
    resp = await client.post(path, json=body, headers=headers)
    assert resp.status == 200, await resp.text()
    assert fake_engine.received[0]["priority"] == tier_priority


@pytest.mark.parametrize("caller_wants_usage", [False, True], ids=["usage-stripped", "usage-kept"])
async def test_stream_usage_chunk_only_when_asked(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory, caller_wants_usage: bool
) -> None:
    client, gateway = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    body = completion(max_tokens=5, stream=True)
    if caller_wants_usage:
        body["stream_options"] = {"include_usage": True}
    resp = await client.post("/v1/completions", json=body, headers=ACME)
    assert resp.status == 200
    events = [line for line in (await resp.text()).split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert len([c for c in chunks if c["choices"]]) == 5
    assert any(c.get("usage") for c in chunks) == caller_wants_usage
    assert fake_engine.received[0]["stream_options"] == {"include_usage": True}  # always asked
    snap = gateway.registry.runtimes["tiny"].snapshot()
    assert snap.in_use_tokens == 0 and snap.in_flight == 0


async def test_budget_charged_at_admission_rejects_with_retry_after(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    config = (
        AdmissionConfigBuilder()
        .tier("batch", floor=50)
        .pool("tiny", [fake_engine.url])
        .tenant("acme", key="sk-acme", tiers=["batch"], limits=[(60, 100)])
        .obj()
    )
    client, _ = await gateway_client(config)
    # each reserves prompt (few tokens) + 40 output: two fit in 100, the third does not
    first = await client.post("/v1/completions", json=completion(max_tokens=40), headers=ACME)
    second = await client.post("/v1/completions", json=completion(max_tokens=40), headers=ACME)
    assert (first.status, second.status) == (200, 200)
    # settled with the engine's usage (5 + 40): 90 used, 10 left
    third = await client.post("/v1/completions", json=completion(max_tokens=40), headers=ACME)
    assert third.status == 429
    assert int(third.headers["Retry-After"]) >= 1
    assert (await third.json())["error"]["code"] == "budget_exceeded"
    assert len(fake_engine.received) == 2


async def test_over_budget_demotes_to_the_next_tier(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    config = (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50)
        .tier("batch", floor=30)
        .rule("interactive", path_prefix="/v1/completions")
        .pool("tiny", [fake_engine.url])
        .tenant(
            "acme",
            key="sk-acme",
            tiers=["interactive", "batch"],
            limits=[(60, 50)],
            over_budget="Demote",
        )
        .obj()
    )
    client, _ = await gateway_client(config)
    for _ in range(2):
        resp = await client.post("/v1/completions", json=completion(max_tokens=40), headers=ACME)
        assert resp.status == 200
    assert [b["priority"] for b in fake_engine.received] == [0, 1]  # the second one ran as batch
    metrics = (await (await client.get("/metrics")).text()).splitlines()
    assert any(
        line.startswith("kvpool_gateway_admission_decisions_total") and 'outcome="demoted"' in line
        for line in metrics
    )


async def test_engine_down_is_503_and_everything_is_released(
    gateway_client: GatewayClientFactory,
) -> None:
    config = (
        AdmissionConfigBuilder()
        .tier("batch", floor=50)
        .pool("tiny", ["http://127.0.0.1:9"])  # discard port: nothing listens
        .tenant("acme", key="sk-acme", tiers=["batch"], limits=[(60, 1000)])
        .obj()
    )
    client, gateway = await gateway_client(config, health_probe_interval=0)  # passive only
    resp = await client.post("/v1/completions", json=completion(max_tokens=10), headers=ACME)
    assert resp.status == 503
    assert (await resp.json())["error"]["code"] == "engine_unavailable"
    assert "Retry-After" in resp.headers
    snap = gateway.registry.runtimes["tiny"].snapshot()
    assert (snap.in_use_tokens, snap.in_flight) == (0, 0)
    used = await gateway.store.usage("default/acme", config.tenants[0].limits, gateway.wall_clock())
    assert used[0].tokens == 0  # the budget was refunded
    # the refusal ejected the replica: the next request is not sent to it at all
    again = await client.post("/v1/completions", json=completion(max_tokens=10), headers=ACME)
    assert again.status == 503 and "Retry-After" in again.headers
    assert (await again.json())["error"]["code"] == "no_ready_replica"
    text = await (await client.get("/metrics")).text()
    assert 'kvpool_gateway_ejections_total{pool="tiny",reason="refused"} 1.0' in text
    assert 'kvpool_gateway_replica_ejected{pool="tiny",replica="tiny-0"} 1.0' in text
    gateway.apply_config(config)  # a reload listing it ready does not bring it back early
    again = await client.post("/v1/completions", json=completion(max_tokens=10), headers=ACME)
    assert (await again.json())["error"]["code"] == "no_ready_replica"


async def test_engine_5xx_is_502(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    fake_engine.status = 500
    client, _ = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    resp = await client.post("/v1/completions", json=completion(), headers=ACME)
    assert resp.status == 502
    assert "engine says no" in (await resp.json())["error"]["message"]


async def test_client_disconnect_cancels_upstream_and_releases(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    fake_engine.chunk_delay = 0.05
    client, gateway = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    resp = await client.post(
        "/v1/completions", json=completion(max_tokens=200, stream=True), headers=ACME
    )
    assert resp.status == 200
    await resp.content.readline()
    resp.close()  # the client goes away mid-stream
    await wait_until_async(
        lambda: (
            gateway.registry.runtimes["tiny"].snapshot().in_flight == 0 and fake_engine.cancelled
        ),
        5,
        "the upstream request cancelled and the reservation released",
    )
    assert fake_engine.cancelled == 1
    assert gateway.registry.runtimes["tiny"].snapshot().in_use_tokens == 0


async def test_reload_keeps_in_flight_requests(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    fake_engine.delay = 0.3
    client, gateway = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    pending = asyncio.ensure_future(
        client.post("/v1/completions", json=completion(max_tokens=3), headers=ACME)
    )
    await wait_until_async(lambda: fake_engine.received, 5, "the request reaching the engine")
    new = standard_admission_config([fake_engine.url], tokens_per_replica=4096)
    new.tenant("newcomer", key="sk-new", tiers=["batch"])
    gateway.apply_config(new.obj())
    resp = await pending
    assert resp.status == 200
    assert gateway.registry.runtimes["tiny"].pool.tokens_per_replica == 4096
    newcomer = await client.post(
        "/v1/completions", json=completion(), headers={"Authorization": "Bearer sk-new"}
    )
    assert newcomer.status == 200


async def test_models_health_and_metrics(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    client, _ = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    models = await (await client.get("/v1/models", headers=ACME)).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert (await client.get("/v1/models")).status == 401
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    await client.post("/v1/chat/completions", json=chat(max_tokens=2), headers=ACME)
    text = await (await client.get("/metrics")).text()
    for series in (
        'kvpool_gateway_queue_seconds_bucket{le="0.001",pool="tiny",tier="interactive"}',
        'kvpool_gateway_admission_decisions_total{outcome="admitted",pool="tiny",tier="interactive"}',
        'kvpool_gateway_tier_tokens{kind="floor",pool="tiny",tier="interactive",track="stable"}',
        'kvpool_gateway_estimates_total{method="fallback",pool="tiny"}',
        'kvpool_gateway_estimate_error_tokens_count{pool="tiny"}',
    ):
        assert series in text, series


async def test_queue_wait_beyond_the_tier_promise_is_rejected_at_once(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """One slot, a slow engine: later requests queue, and time out at maxQueueWait (503)."""
    fake_engine.delay = 1.0
    config = (
        AdmissionConfigBuilder()
        .tier("batch", floor=100, wait=0.2)
        .pool("tiny", [fake_engine.url], slots_per_replica=1)
        .tenant("acme", key="sk-acme", tiers=["batch"])
        .obj()
    )
    client, _ = await gateway_client(config)
    results = await asyncio.gather(
        *(
            client.post("/v1/completions", json=completion(max_tokens=2), headers=ACME)
            for _ in range(3)
        )
    )
    statuses = sorted(r.status for r in results)
    assert statuses[0] == 200
    assert set(statuses[1:]) == {503}
    rejected = [r for r in results if r.status == 503]
    assert all("Retry-After" in r.headers for r in rejected)


async def test_plan_share_splits_the_plan_between_gateway_replicas(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """Two gateways at 50% each admit, together, no more than the plan: 2 slots -> 1 each."""
    fake_engine.delay = 1.0
    config = (
        AdmissionConfigBuilder()
        .tier("batch", floor=100, wait=0.2)
        .pool("tiny", [fake_engine.url], slots_per_replica=2)
        .tenant("acme", key="sk-acme", tiers=["batch"])
        .obj()
    )
    client, gateway = await gateway_client(config, plan_share_percent=50)

    assert gateway.registry.runtimes["tiny"].pool.slots_per_replica == 1
    results = await asyncio.gather(
        *(
            client.post("/v1/completions", json=completion(max_tokens=2), headers=ACME)
            for _ in range(2)
        )
    )
    assert sorted(r.status for r in results) == [200, 503]


async def test_plan_share_splits_a_tenants_max_concurrency_too(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """A tenant's maxConcurrency is counted per gateway process like the plan: two gateways
    at 50% each let it run 2 of its 4 at once, not 4 each (8 in all)."""
    fake_engine.hold = asyncio.Event()
    config = (
        AdmissionConfigBuilder()
        .tier("batch", floor=100, wait=0.2)
        .pool("tiny", [fake_engine.url], slots_per_replica=64)
        .tenant("acme", key="sk-acme", tiers=["batch"], max_concurrency=4)
        .obj()
    )
    client, _ = await gateway_client(config, plan_share_percent=50)

    sent = [
        asyncio.create_task(
            client.post("/v1/completions", json=completion(max_tokens=2), headers=ACME)
        )
        for _ in range(4)
    ]
    await wait_until_async(lambda: len(fake_engine.received) == 2, 5, "two at the engine")
    # the other two wait out the tier's 0.2 s queue wait and are turned away
    await wait_until_async(lambda: sum(t.done() for t in sent) == 2, 5, "two turned away")
    fake_engine.hold.set()
    results = await asyncio.gather(*sent)
    assert len(fake_engine.received) == 2
    assert sorted(r.status for r in results) == [200, 200, 503, 503]


async def test_gateway_replicas_share_the_engines_poll_budget(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """vLLM renders its whole /metrics on the loop that relays its tokens, so N gateway
    replicas (a 100/N plan share) each poll an engine every N x --engine-poll-seconds: the
    engine is polled at that rate in all, not N times as often."""
    fake_engine.metrics_text = _vllm_metrics(0.1, 0)
    await gateway_client(
        standard_admission_config([fake_engine.url]).obj(),
        plan_share_percent=25,  # one of four gateway replicas
        engine_poll_seconds=0.05,  # all four together: every 50 ms; this one every 200 ms
    )
    await wait_until_async(lambda: len(fake_engine.metrics_polls) >= 4, 10, "four polls")
    first, fourth = fake_engine.metrics_polls[0], fake_engine.metrics_polls[3]
    assert fourth - first >= 3 * 0.2 * 0.9, f"polled every {(fourth - first) / 3:.3f}s"


async def test_session_pool_reuses_connections(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    client, gateway = await gateway_client(standard_admission_config([fake_engine.url]).obj())
    for _ in range(5):
        assert (await client.post("/v1/completions", json=completion(), headers=ACME)).status == 200
    assert gateway._session is not None
    connector = gateway._session.connector
    assert isinstance(connector, aiohttp.TCPConnector)
    assert sum(len(v) for v in connector._conns.values()) == 1  # one pooled keep-alive


async def test_long_prompts_are_sized_by_the_learned_bound_after_exact_counts(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory, tiny_tokenizer_json: Path
) -> None:
    """Docs/0009: eight long chats are counted exactly (the pool's ratio is learned), the
    next ones by the bound; each is served, the upstream keeps the caller's max_tokens,
    and the metric tells the methods apart."""
    config = standard_admission_config(
        [fake_engine.url],
        max_model_len=1 << 20,
        tokenizer_path=tiny_tokenizer_json,
        tokens_per_replica=1 << 22,
    )
    client, gateway = await gateway_client(config.obj())
    words = ["the", "model", "serves", "tokens", "quickly", "and", "a", "request", "waits"]
    for i in range(10):
        text = " ".join(words[(i + j) % len(words)] for j in range(5000))  # ~28 KB
        resp = await client.post(
            "/v1/chat/completions", json=chat(text, max_tokens=40), headers=ACME
        )
        assert resp.status == 200, await resp.text()
    assert [r.get("max_completion_tokens", r.get("max_tokens")) for r in fake_engine.received] == [
        40
    ] * 10
    text = await (await client.get("/metrics")).text()
    assert 'kvpool_gateway_estimates_total{method="tokenizer",pool="tiny"} 8.0' in text
    assert 'kvpool_gateway_estimates_total{method="bound",pool="tiny"} 2.0' in text
    snap = gateway.registry.runtimes["tiny"].snapshot()
    assert (snap.in_use_tokens, snap.in_flight) == (0, 0)


def _word_tokenizer(folder: Path, template: str | None) -> Path:
    """A word-level tokenizer.json (and a chat template) built on the spot."""
    vocab = {w: i for i, w in enumerate(["[UNK]", "<s>", "hello", "world", "<|user|>", "</s>"])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    if template is not None:
        config = {"chat_template": template, "bos_token": "<s>"}
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder / "tokenizer.json"


@pytest.mark.parametrize(
    ("template", "messages", "expected"),
    [
        (
            "{{ bos_token }} {% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> "
            "{% endfor %}",
            [{"role": "user", "content": "hello world"}],
            5,  # <s> <|user|> hello world </s>
        ),
        (None, [{"role": "user", "content": "hello world"}], 2 + 8),  # contents + 8 a message
        (
            "{{ raise_exception('no system role') }}",
            [{"role": "system", "content": "hello"}],
            1 + 8,  # a template that raises: contents + 8
        ),
    ],
    ids=["chat-template", "no-template", "template-raises"],
)
def test_tokenizer_counts_chat(
    tmp_path: Path, template: str | None, messages: list[dict[str, str]], expected: int
) -> None:
    loaded = TokenizerCache().get(str(_word_tokenizer(tmp_path, template)))
    assert loaded is not None
    assert loaded.count_chat(messages) == expected
    assert loaded.count_prompt("hello hello world") == 3
    assert loaded.count_prompt([7, 8, 9, 10]) == 4


@pytest.mark.parametrize(
    "setup",
    ["missing", "not-json", "folder"],
    ids=["missing-file-is-none", "broken-file-is-none", "folder-holding-tokenizer-json"],
)
def test_tokenizer_cache_loads_once_and_never_raises(tmp_path: Path, setup: str) -> None:
    cache = TokenizerCache()
    if setup == "missing":
        path = str(tmp_path / "nope.json")
    elif setup == "not-json":
        (tmp_path / "tokenizer.json").write_text("{")
        path = str(tmp_path / "tokenizer.json")
    else:
        _word_tokenizer(tmp_path, None)
        path = str(tmp_path)
    first = cache.get(path)
    assert (first is not None) == (setup == "folder")
    assert cache.get(path) is first  # cached, failures included


async def test_tier_policy_decides_what_a_tier_gets_while_redis_is_down(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """Given Redis unreachable and the --fail-closed-tier flag naming batch, the TierPolicy
    wins: interactive declares budgetUnavailable Reject (503 + Retry-After), batch declares
    Allow (served from the local allowance); the fallback metric counts exactly that."""
    config = (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, budget_unavailable="Reject")
        .tier("batch", floor=30, budget_unavailable="Allow")
        .rule("interactive", path_prefix="/v1/chat")
        .pool("tiny", [fake_engine.url])
        .tenant("acme", key="sk-acme", tiers=["interactive", "batch"], limits=[(60, 10_000)])
        .obj()
    )
    metrics = GatewayMetrics()
    store = FailoverBudgetStore(
        RedisBudgetStore("redis://127.0.0.1:1/0", timeout=0.05),  # nothing listens on port 1
        FailoverPolicy(fail_closed_tiers=frozenset({"batch"})),
        on_fallback=lambda tier, result: metrics.budget_fallback.labels(tier, result).inc(),
    )
    client, _ = await gateway_client(config, store, metrics=metrics)
    rejected = await client.post("/v1/chat/completions", json=chat(), headers=ACME)
    assert rejected.status == 503 and "Retry-After" in rejected.headers
    assert (await rejected.json())["error"]["code"] == "budget_unavailable"
    served = await client.post("/v1/completions", json=completion(max_tokens=4), headers=ACME)
    assert served.status == 200
    text = await (await client.get("/metrics")).text()
    assert 'kvpool_gateway_budget_fallback_total{result="reject",tier="interactive"} 1.0' in text
    assert 'kvpool_gateway_budget_fallback_total{result="local",tier="batch"} 1.0' in text
    assert 'result="local",tier="interactive"' not in text


def _vllm_metrics(usage: float, preemptions: int) -> str:
    return (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {usage}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="tiny"} 3.0\n'
        "# TYPE vllm:num_preemptions counter\n"
        f'vllm:num_preemptions_total{{engine="0",model_name="tiny"}} {preemptions}\n'
    )


async def _metric(client: TestClient[Any, Any], name: str, **labels: str) -> float:
    text = await (await client.get("/metrics")).text()
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


async def test_engines_near_full_pause_borrowing_and_preemptions_back_off(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """Issue 8.3: the engines' own /metrics correct admission."""
    fake_engine.hold = asyncio.Event()  # requests stay in flight until the test is done looking
    fake_engine.metrics_text = _vllm_metrics(0.5, 0)
    client, gateway = await gateway_client(
        standard_admission_config([fake_engine.url]).obj(), engine_poll_seconds=0.05
    )
    await wait_until_async(  # far enough below 1 that a back-off (+0.1) shows whole
        lambda: _ok(_metric(client, "kvpool_gateway_overcommit_ratio", tier="batch"), below=0.8),
        5,
        "the batch ratio creeping down while the engine reports no preemptions",
    )

    fake_engine.metrics_text = _vllm_metrics(0.99, 0)
    await wait_until_async(
        lambda: _ok(_metric(client, "kvpool_gateway_borrowing_paused", pool="tiny"), above=0.5),
        5,
        "borrowing paused on an engine 99 % full",
    )
    # batch's floor is 614 tokens / 2 slots: two requests of ~520 tokens each exceed it
    big = completion(prompt=[1] * 400, max_tokens=100)
    runtime = gateway.registry.runtimes["tiny"]
    first = asyncio.create_task(client.post("/v1/completions", json=big, headers=BULK))
    await wait_until_async(lambda: fake_engine.received, 5, "the first request at the engine")
    second = asyncio.create_task(client.post("/v1/completions", json=big, headers=BULK))
    await wait_until_async(
        lambda: runtime.snapshot().in_flight + runtime.snapshot().queued == 2,
        5,
        "the second request admitted or queued",
    )
    snap = runtime.snapshot()
    assert (snap.in_flight, snap.queued) == (1, 1), "a borrower started while paused"

    # quiet polls only lower the ratio: the last value before the preemptions bounds it
    before = await _metric(client, "kvpool_gateway_overcommit_ratio", tier="batch")
    fake_engine.metrics_text = _vllm_metrics(0.5, 7)  # room again, but the engine preempted
    await wait_until_async(
        lambda: _ok(
            _metric(client, "kvpool_gateway_engine_preemptions_total", pool="tiny"), above=6.5
        ),
        5,
        "the engine's preemptions polled",
    )
    after = await _metric(client, "kvpool_gateway_overcommit_ratio", tier="batch")
    fake_engine.hold.set()
    responses = await asyncio.gather(first, second)
    assert [r.status for r in responses] == [200, 200]
    preempted = await _metric(client, "kvpool_gateway_engine_preemptions_total", pool="tiny")
    assert preempted == 7.0
    # the back-off is +0.1 at the poll that saw them, less 0.01 a quiet poll since
    assert after >= before + 0.05, (
        f"no back-off after preemptions: ratio {before:.2f} before, {after:.2f} after"
    )
    assert await _metric(client, "kvpool_gateway_overcommit_ratio", tier="interactive") == 1.0


async def _ok(
    value: Awaitable[float], *, below: float | None = None, above: float | None = None
) -> bool:
    got = await value
    return (below is None or got < below) and (above is None or got > above)


async def test_ttft_over_the_target_throttles_what_is_lent_below(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """Issue 8.4: streamed TTFT above the interactive target lowers the lent limit."""
    fake_engine.delay = 0.03  # every first token takes >= 30 ms; the target is 10 ms
    config = (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=5.0, ttft=0.01)
        .tier("batch", floor=30, wait=5.0)
        .rule("interactive", path_prefix="/v1/chat", labels={"class": "interactive"})
        .pool("tiny", [fake_engine.url])
        .tenant(
            "acme", key="sk-acme", tiers=["interactive", "batch"], labels={"class": "interactive"}
        )
    )
    client, gateway = await gateway_client(config.obj(), engine_poll_seconds=0)
    assert await _metric(client, "kvpool_gateway_lent_limit", tier="interactive") == 8.0
    for _ in range(20):
        resp = await client.post(
            "/v1/chat/completions", json=chat(stream=True, max_tokens=2), headers=ACME
        )
        await resp.read()

    limit = await _metric(client, "kvpool_gateway_lent_limit", tier="interactive")
    p95 = await _metric(client, "kvpool_gateway_tier_ttft_p95_seconds", tier="interactive")
    target = await _metric(client, "kvpool_gateway_tier_ttft_target_seconds", tier="interactive")
    assert (limit, target) == (2.0, 0.01), f"limit {limit}: 8 -> 4 -> 2 after two decisions"
    assert p95 >= 0.03
    assert gateway.registry.runtimes["tiny"].controller._lending.limits == {0: 2}


def _protected_config(url: str, ttft: float | None) -> AdmissionConfigBuilder:
    """interactive (with the TTFT target ``ttft``) and batch on one fake replica."""
    return (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=5.0, ttft=ttft)
        .tier("batch", floor=30, wait=5.0)
        .rule("interactive", path_prefix="/v1/chat", labels={"class": "interactive"})
        .pool("tiny", [url])
        .tenant(
            "acme", key="sk-acme", tiers=["interactive", "batch"], labels={"class": "interactive"}
        )
    )


async def _slow_chats(client: TestClient[Any, Any], count: int) -> None:
    for _ in range(count):
        resp = await client.post(
            "/v1/chat/completions", json=chat(stream=True, max_tokens=2), headers=ACME
        )
        await resp.read()


async def test_an_idle_protected_tier_gets_the_lent_limit_back(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """Issue 18.3: slow first tokens took the lent limit down, and it stayed down while the
    protected tier sat idle (batch held to its floor in an idle pool) until a restart."""
    fake_engine.delay = 0.03  # every first token takes >= 30 ms; the target is 10 ms
    client, gateway = await gateway_client(
        _protected_config(fake_engine.url, 0.01).obj(), engine_poll_seconds=0.05
    )
    await _slow_chats(client, 20)
    assert await _metric(client, "kvpool_gateway_lent_limit", tier="interactive") == 2.0
    idle_from = asyncio.get_running_loop().time()

    with contextlib.suppress(WaitTimeoutError):  # the figures are asserted below
        await wait_until_async(
            lambda: _ok(_metric(client, "kvpool_gateway_lent_limit", tier="interactive"), above=7),
            10,
        )

    idle = asyncio.get_running_loop().time() - idle_from
    limit = await _metric(client, "kvpool_gateway_lent_limit", tier="interactive")
    lent = gateway.registry.runtimes["tiny"].controller._lending.limits
    assert (limit, lent) == (8.0, {0: 8}), (
        f"lent limit {limit} (controller {lent}) after {idle:.1f} s with interactive idle"
    )
    p95 = await _metric(client, "kvpool_gateway_tier_ttft_p95_seconds", tier="interactive")
    assert math.isnan(p95), f"the p95 of samples from before the idle period is exported: {p95}"


@pytest.mark.parametrize(
    ("new_ttft", "gauges"),
    [(None, {"limit": None, "target": None}), (0.5, {"limit": 8.0, "target": 0.5})],
    ids=["target-removed", "target-changed"],
)
async def test_a_reload_that_removes_or_changes_the_target_resets_the_lent_limit(
    fake_engine: FakeEngine,
    gateway_client: GatewayClientFactory,
    new_ttft: float | None,
    gauges: dict[str, float | None],
) -> None:
    """Issue 18.3: the limit survived a reload that removed the target (only a restart
    cleared it) and its gauges went stale."""
    fake_engine.delay = 0.03
    client, gateway = await gateway_client(
        _protected_config(fake_engine.url, 0.01).obj(), engine_poll_seconds=0
    )
    await _slow_chats(client, 20)
    assert gateway.registry.runtimes["tiny"].controller._lending.limits == {0: 2}

    gateway.apply_config(_protected_config(fake_engine.url, new_ttft).obj())

    lent = gateway.registry.runtimes["tiny"].controller._lending.limits
    assert lent == {}, f"lent limits {lent} after a reload to target {new_ttft}"
    exported = {
        "limit": await _metric(client, "kvpool_gateway_lent_limit", tier="interactive"),
        "target": await _metric(
            client, "kvpool_gateway_tier_ttft_target_seconds", tier="interactive"
        ),
    }
    expected = {k: float("nan") if v is None else v for k, v in gauges.items()}
    assert {k: str(v) for k, v in exported.items()} == {k: str(v) for k, v in expected.items()}, (
        f"exported after the reload: {exported}"
    )


def _held_config(url: str, ttft: float | None) -> AdmissionConfig:
    """interactive (with or without a ttftP95Target) and batch on one replica."""
    return (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=5.0, ttft=ttft)
        .tier("batch", floor=30, wait=5.0)
        .rule("interactive", path_prefix="/v1/chat", labels={"class": "interactive"})
        .pool("tiny", [url])
        .tenant("acme", key="sk-acme", tiers=["interactive"], labels={"class": "interactive"})
        .tenant("bulk", key="sk-bulk", tiers=["batch"])
        .obj()
    )


async def _seconds_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until ``predicate`` held (polled on the loop); fails with ``what``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    await wait_until_async(predicate, timeout, what, interval=0.01)
    return loop.time() - start


@pytest.mark.parametrize(
    ("ttft", "stream", "held"),
    [(2.0, True, "until-first-token"), (0.3, False, "until-target"), (None, True, "no")],
    ids=["held-until-the-first-token", "held-at-most-the-target", "no-target-no-hold"],
)
async def test_interactive_prefill_holds_batch_off_its_replica(
    gateway_client: GatewayClientFactory, ttft: float | None, stream: bool, held: str
) -> None:
    """While an interactive request (tier with a ttftP95Target) waits for its first token,
    no batch request is sent to its replica: the engine would run both prefills in one
    step. The engine answers each request after 0.8 s, then streams a token every 0.5 s."""
    fake_engine = await FakeEngine(delay=0.8, chunk_delay=0.5).start()
    try:
        client, _ = await gateway_client(_held_config(fake_engine.url, ttft))
        chat_task = asyncio.create_task(
            client.post(
                "/v1/chat/completions", json=chat(stream=stream, max_tokens=4), headers=ACME
            )
        )
        await _seconds_until(
            lambda: len(fake_engine.received) == 1, 2.0, "the chat reaches the engine"
        )
        batch_task = asyncio.create_task(
            client.post("/v1/completions", json=completion(max_tokens=2), headers=BULK)
        )
        await _seconds_until(lambda: len(fake_engine.received) == 2, 3.0, "the batch reaches it")
        # as the engine saw it: how late the test noticed the chat does not count
        waited = fake_engine.arrivals[1] - fake_engine.arrivals[0]
        if held == "no":
            assert waited < 0.4, f"batch waited {waited:.2f}s with no hold"
        elif held == "until-target":
            assert 0.1 < waited < 0.6, f"batch waited {waited:.2f}s; the hold is 0.3 s at most"
        else:
            # the token comes at 0.8 s; the target (2 s) would end the hold much later
            assert 0.5 < waited < 1.5, f"batch reached the engine {waited:.2f}s in"
        chat_resp, batch_resp = await chat_task, await batch_task
        assert (chat_resp.status, batch_resp.status) == (200, 200)
        await chat_resp.read()
        await batch_resp.read()
    finally:
        await fake_engine.stop()


async def test_usage_gauges_of_replicas_no_longer_polled_are_dropped(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory
) -> None:
    """kvpool_gateway_engine_kv_usage{pool,replica} follows the replicas the gateway polls:
    a replica that left the config, and a pool that did, leave no stale series."""
    fake_engine.metrics_text = _vllm_metrics(0.42, 0)
    _, gateway = await gateway_client(
        standard_admission_config([fake_engine.url, fake_engine.url]).obj(),
        engine_poll_seconds=0.05,
    )

    def usage(replica: str, pool: str = "tiny") -> float | None:
        return gateway.metrics.registry.get_sample_value(
            "kvpool_gateway_engine_kv_usage", {"pool": pool, "replica": replica}
        )

    await _seconds_until(lambda: usage("tiny-1") == 0.42, 3.0, "both replicas are polled")
    gateway.apply_config(standard_admission_config([fake_engine.url]).obj())
    await _seconds_until(lambda: usage("tiny-1") is None, 3.0, "tiny-1's gauge is dropped")
    assert usage("tiny-0") == 0.42
    gateway.apply_config(
        standard_admission_config([fake_engine.url]).pool("other", [fake_engine.url]).obj()
    )
    await _seconds_until(lambda: usage("other-0", "other") == 0.42, 3.0, "the other pool is polled")
    only_other = AdmissionConfigBuilder().tier("interactive", floor=50).tier("batch", floor=30)
    gateway.apply_config(only_other.pool("other", [fake_engine.url]).obj())
    await _seconds_until(lambda: usage("tiny-0") is None, 3.0, "the removed pool's gauge goes")
    assert usage("other-0", "other") == 0.42
