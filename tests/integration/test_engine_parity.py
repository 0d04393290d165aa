"""Parity with the engine (issue 8.1) and what the gateway learns from it (8.3, 8.4).

Given one REAL vLLM CPU engine (tiny model, maxModelLen 512, 2048 KV tokens, 8 sequences)
and a gateway in front of it with the pool's tokenizer, each request shape of the table is
sent to the engine directly and through the gateway: both must answer the same status
class (2xx or the same 4xx). Where both serve it, the tokens the engine generated through
the gateway never exceed what the gateway charged (issue 9.1: no request shape generates
more than it was charged for), and every reservation is released afterwards.

Then, on the same engine: its ``/metrics`` are read by the engine-load adapter (KV usage
rises while a request runs); and a gateway with the engine poll on learns a tier's output
(its next unbounded request reserves the learned output, not the context), measures TTFT
of streamed requests, exports the tier's TTFT target, lent limit and overcommit ratio, and
lets the lower tier's ratio creep below 1 while the engine reports no preemptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvpool.adapters.engine_metrics import fetch_engine_load
from tests.builders import AdmissionConfigBuilder, tiny_engine_admission_config
from tests.support.engine import VllmEngine
from tests.support.gateway import GatewayClientFactory
from tests.support.waiting import StopWaitingError, WaitTimeoutError, wait_until_async

pytestmark = [pytest.mark.engine]

ACME = {"Authorization": "Bearer sk-acme"}
MAX_MODEL_LEN = 512
IDLE_POLLS = 10  # polls of an idle engine that must leave the overcommit ratio alone


def _ids(count: int, start: int = 10) -> list[int]:
    return [start + i % 200 for i in range(count)]


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], **extra}


def _completion(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, **extra}


# id -> (path, body). Outputs are kept short where the shape allows, to keep the run fast.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "prompt-plus-max-tokens-over-the-context": (
        "/v1/completions",
        _completion(_ids(401), max_tokens=120),
    ),
    "prompt-fills-the-context": ("/v1/completions", _completion(_ids(MAX_MODEL_LEN))),
    "prompt-over-the-context": ("/v1/completions", _completion(_ids(MAX_MODEL_LEN + 40))),
    "prompt-one-below-the-context": (
        "/v1/completions",
        _completion(_ids(MAX_MODEL_LEN - 1), max_tokens=50),
    ),
    "completions-without-max-tokens": ("/v1/completions", _completion("the quick brown fox")),
    "completions-null-max-tokens": (
        "/v1/completions",
        _completion(_ids(490), max_tokens=None),
    ),
    "chat-without-max-tokens": ("/v1/chat/completions", _chat(stop=["."], temperature=0)),
    "chat-max-completion-tokens-past-the-context": (
        "/v1/chat/completions",
        _chat(max_completion_tokens=5000),
    ),
    "chat-max-completion-tokens-equal-to-the-context": (
        "/v1/chat/completions",
        _chat(max_completion_tokens=MAX_MODEL_LEN, stop=["."]),
    ),
    "completions-max-tokens-over-the-context": (
        "/v1/completions",
        _completion("a", max_tokens=MAX_MODEL_LEN + 1),
    ),
    "list-of-prompts": ("/v1/completions", _completion(["one", "two two", "three"], max_tokens=4)),
    "list-of-token-prompts": (
        "/v1/completions",
        _completion([_ids(5), _ids(300)], max_tokens=300),
    ),
    "list-with-one-prompt-too-long": (
        "/v1/completions",
        _completion([_ids(5), _ids(600)], max_tokens=4),
    ),
    "n-3": ("/v1/completions", _completion("a b c", n=3, max_tokens=4)),
    "n-beyond-the-engine-batch": ("/v1/completions", _completion("a b c", n=10, max_tokens=4)),
    "n-times-context-beyond-the-kv-cache": (
        "/v1/completions",
        _completion(_ids(300), n=8, max_tokens=200),
    ),
    "max-tokens-zero": ("/v1/completions", _completion("a", max_tokens=0)),
    "n-zero": ("/v1/completions", _completion("a", n=0, max_tokens=2)),
    "stream-with-usage": (
        "/v1/completions",
        _completion("a b", max_tokens=3, stream=True, stream_options={"include_usage": True}),
    ),
    "chat-stream-without-max-tokens": (
        "/v1/chat/completions",
        _chat(stream=True, max_tokens=None),
    ),
    # what clients send besides: sampling options, several choices, both output bounds
    "chat-n-2": ("/v1/chat/completions", _chat(n=2, max_tokens=4)),
    "chat-max-tokens-and-max-completion-tokens": (
        "/v1/chat/completions",
        _chat(max_tokens=2, max_completion_tokens=6, ignore_eos=True),
    ),
    "chat-multi-turn-non-ascii": (
        "/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "Réponds en français, s'il te plaît."},
                {"role": "user", "content": "Grüße! 你好 🙂"},
                {"role": "assistant", "content": "Bonjour."},
                {"role": "user", "content": "Encore ?"},
            ],
            "max_tokens": 4,
        },
    ),
    "min-tokens-over-max-tokens": (
        "/v1/completions",
        _completion("a b", max_tokens=2, min_tokens=5),
    ),
    "echo-and-logprobs": (
        "/v1/completions",
        _completion("a b c", max_tokens=3, echo=True, logprobs=2),
    ),
    "empty-prompt": ("/v1/completions", _completion("", max_tokens=2)),
    "stream-without-usage": (
        "/v1/completions",
        _completion("a b", max_tokens=3, stream=True, stream_options={"include_usage": False}),
    ),
    "seed-temperature-top-p": (
        "/v1/completions",
        _completion("a b", max_tokens=3, seed=11, temperature=0.7, top_p=0.9),
    ),
}


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with session.post(url, json=body, headers=ACME) as resp:
        return resp.status, await resp.text()


def _status_class(status: int) -> int | str:
    return "2xx" if 200 <= status < 300 else status


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("path", "body"), list(SHAPES.values()), ids=list(SHAPES))
async def test_gateway_answers_like_the_engine(
    tiny_engine: VllmEngine,
    tiny_tokenizer_json: Path,
    gateway_client: GatewayClientFactory,
    path: str,
    body: dict[str, Any],
) -> None:
    client, gw = await gateway_client(
        tiny_engine_admission_config(tiny_engine.base_url, tiny_tokenizer_json, wait=60.0)
    )
    async with aiohttp.ClientSession() as session:
        direct_status, direct_text = await _post(session, tiny_engine.base_url + path, body)
    resp = await client.post(path, json=body, headers=ACME)
    via_text = await resp.text()
    assert _status_class(resp.status) == _status_class(direct_status), (
        f"engine {direct_status}: {direct_text[:300]}\ngateway {resp.status}: {via_text[:300]}"
    )
    snap = gw.registry.runtimes["tiny"].snapshot()
    assert (snap.in_use_tokens, snap.in_use_slots, snap.in_flight) == (0, 0, 0)
    if resp.status == 200:
        metrics = gw.metrics.render().decode()
        reserved = _sample(metrics, "kvpool_gateway_reserved_tokens_total")
        actual = _sample(metrics, "kvpool_gateway_actual_tokens_total")
        charged = _sample(metrics, "kvpool_gateway_bound_tokens_total")
        assert actual <= charged, f"generated {actual} > charged {charged} (reserved {reserved})"


def _sample(metrics: str, name: str, *labels: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(label in line for label in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.timeout(120)
async def test_engine_load_is_read_from_the_engines_own_metrics(tiny_engine: VllmEngine) -> None:
    async with aiohttp.ClientSession() as session:
        idle = await fetch_engine_load(session, tiny_engine.base_url)
        body = _completion(_ids(300), max_tokens=200, ignore_eos=True)
        running = asyncio.create_task(
            _post(session, tiny_engine.base_url + "/v1/completions", body)
        )
        busiest = 0.0

        async def sample_until_done() -> bool:
            """One reading of the engine while the request runs; True once it ended."""
            nonlocal busiest
            load = await fetch_engine_load(session, tiny_engine.base_url)
            if load is None:
                raise StopWaitingError("the engine's /metrics did not answer while it ran")
            busiest = max(busiest, load.kv_usage)
            return running.done()

        await wait_until_async(sample_until_done, 100, "the request's end", interval=0.02)
        status, _ = await running
        gone = await fetch_engine_load(session, "http://127.0.0.1:1")
        async with session.get(tiny_engine.metrics_url) as resp:
            raw = await resp.text()
        final = await fetch_engine_load(session, tiny_engine.base_url)
    assert final is not None
    assert final.preemptions_total == _sample(raw, "vllm:num_preemptions_total")
    assert final.running == _sample(raw, "vllm:num_requests_running")
    assert idle is not None and 0.0 <= idle.kv_usage <= 1.0 and idle.preemptions_total >= 0
    assert status == 200
    assert busiest > 0.0, "the engine never reported KV usage while a 500-token request ran"
    assert gone is None


@pytest.mark.timeout(240)
async def test_gateway_learns_outputs_measures_ttft_and_adapts(
    tiny_engine: VllmEngine, tiny_tokenizer_json: Path, gateway_client: GatewayClientFactory
) -> None:
    config = tiny_engine_admission_config(
        tiny_engine.base_url, tiny_tokenizer_json, wait=60.0, ttft=0.5
    )
    client, gw = await gateway_client(config, engine_poll_seconds=0.05)
    for _ in range(20):  # the top tier's TTFT samples (streamed chats)
        resp = await client.post(
            "/v1/chat/completions",
            json=_chat(max_completion_tokens=8, ignore_eos=True, stream=True),
            headers=ACME,
        )
        assert resp.status == 200
        await resp.read()
    # the batch tier (completions) learns from requests allowed the whole context that stop
    # after 3 tokens (temperature 0: the same 3 tokens every time)
    short = {"stop": [" "], "temperature": 0}
    for _ in range(20):
        resp = await client.post(
            "/v1/completions",
            json=_completion("hello there", max_tokens=MAX_MODEL_LEN, **short),
            headers=ACME,
        )
        assert resp.status == 200
        await resp.read()
    unbounded = {"stop": ["."], "temperature": 0}
    before = gw.metrics.render().decode()
    resp = await client.post(
        "/v1/completions",
        json=_completion("hello there", max_tokens=MAX_MODEL_LEN, **unbounded),
        headers=ACME,
    )
    assert resp.status == 200, await resp.text()
    await resp.read()
    middle = gw.metrics.render().decode()
    resp = await client.post(
        "/v1/chat/completions",
        json=_chat(max_completion_tokens=MAX_MODEL_LEN, **unbounded),
        headers=ACME,
    )
    assert resp.status == 200, await resp.text()
    await resp.read()
    idle_from = tiny_engine.log_path.stat().st_size
    await wait_until_async(  # the claim: nothing changes over these polls (one answer
        # more: the watcher polls one at a time, so the poll before it has been applied)
        lambda: _metrics_answers(tiny_engine, idle_from) >= IDLE_POLLS + 1,
        10,
        f"{IDLE_POLLS} polls of the idle engine",
    )
    quiet = _sample(gw.metrics.render().decode(), "kvpool_gateway_overcommit_ratio", 'tier="batch"')
    seen: list[str] = []  # the gateway's view at each check, for a failure's message

    def ratio_crept() -> bool:
        text = gw.metrics.render().decode()
        ratio = _sample(text, "kvpool_gateway_overcommit_ratio", 'tier="batch"')
        view = (
            f"ratio {ratio}, usage {_sample(text, 'kvpool_gateway_engine_kv_usage')}, "
            f"preemptions {_sample(text, 'kvpool_gateway_engine_preemptions_total')}"
        )
        if not seen or seen[-1] != view:
            seen.append(view)
        return ratio < 1.0

    try:  # each busy poll without preemptions lets the ratio creep
        await _keep_busy_until(
            tiny_engine, ratio_crept, 30, "the batch ratio creeping down over busy, quiet polls"
        )
    except WaitTimeoutError as exc:
        raise AssertionError(f"{exc}; the gateway's last views: {seen[-12:]}") from exc
    await wait_until_async(
        lambda: _sample(gw.metrics.render().decode(), "kvpool_gateway_borrowing_paused") == 0,
        10,
        "borrowing resumed once the direct load ended",
    )
    after = gw.metrics.render().decode()

    def delta(name: str, start: str, end: str) -> float:
        return _sample(end, name) - _sample(start, name)

    reserved, bound = (
        delta("kvpool_gateway_reserved_tokens_total", before, middle),
        delta("kvpool_gateway_bound_tokens_total", before, middle),
    )
    assert bound > 400, f"the unbounded request's bound is the context, got {bound}"
    assert reserved < bound - 400, f"batch reserved {reserved} of bound {bound}: nothing learned"
    top_reserved, top_bound = (
        delta("kvpool_gateway_reserved_tokens_total", middle, after),
        delta("kvpool_gateway_bound_tokens_total", middle, after),
    )
    assert top_bound > 400
    assert top_reserved == top_bound, "the top tier reserves its whole bound (never preempted)"
    chat = 'tier="interactive"'
    assert _sample(after, "kvpool_gateway_tier_ttft_seconds_count", chat) >= 20
    assert _sample(after, "kvpool_gateway_tier_ttft_target_seconds", chat) == 0.5
    assert _sample(after, "kvpool_gateway_lent_limit", chat) >= 1
    assert _sample(after, "kvpool_gateway_overcommit_ratio", chat) == 1.0
    assert quiet == 1.0, f"batch ratio {quiet} after idle polls: an idle engine is no evidence"
    batch_ratio = _sample(after, "kvpool_gateway_overcommit_ratio", 'tier="batch"')
    assert 0.5 <= batch_ratio < 1.0, f"batch ratio {batch_ratio}: no creep while busy"


async def _keep_busy_until(
    engine: VllmEngine, done: Callable[[], bool], timeout: float, what: str
) -> None:
    """Keep ``engine`` busy with a direct load until ``done()`` (``what``), within
    ``timeout`` seconds.

    Four different prompts at a time (one shared prompt is one set of cached blocks, and
    the usage stayed under the busy mark until near the end), 9 blocks each at prefill
    (56 % of 64) and 13 at the end (81 %: no preemption). Four such requests last about
    0.3 s here, a handful of engine polls; a CI run once saw no busy poll in them, so the
    load goes on, four after four, until ``done()``."""
    finished = asyncio.Event()
    statuses: list[int] = []

    async def load(session: aiohttp.ClientSession) -> None:
        while not finished.is_set():
            answers = await asyncio.gather(
                *(
                    _post(
                        session,
                        engine.base_url + "/v1/completions",
                        _completion(_ids(280, start=10 + 37 * k), max_tokens=120, ignore_eos=True),
                    )
                    for k in range(4)
                )
            )
            statuses.extend(status for status, _ in answers)

    async with aiohttp.ClientSession() as session:
        running = asyncio.create_task(load(session))
        try:
            await wait_until_async(done, timeout, what)
        finally:
            finished.set()
            await running
    assert statuses and set(statuses) == {200}, f"the direct load's answers: {statuses}"


def _metrics_answers(engine: VllmEngine, since: int) -> int:
    """The engine's answers to GET /metrics logged after byte ``since`` of its log (its
    access log): the gateway's polls, while nothing else reads them."""
    with engine.log_path.open("rb") as log:
        log.seek(since)
        return log.read().count(b'"GET /metrics HTTP/1.1" 200')


async def _engine_metrics(engine: VllmEngine) -> str:
    async with aiohttp.ClientSession() as session, session.get(engine.metrics_url) as resp:
        return await resp.text()


def _two_batch_tenants(engine: VllmEngine, tokenizer: Path) -> AdmissionConfigBuilder:
    """The tiny engine's pool (2,048 tokens, 8 slots) with two batch tenants."""
    return (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=60.0)
        .tier("batch", floor=30, wait=60.0)
        .rule("interactive", path_prefix="/v1/chat")
        .pool(
            "tiny",
            [engine.base_url],
            tokens_per_replica=2048,
            slots_per_replica=8,
            max_model_len=MAX_MODEL_LEN,
            output_p95=64,
            tokenizer_path=tokenizer,
        )
        .tenant("cheap", key="sk-cheap", tiers=["batch"])
        .tenant("victim", key="sk-victim", tiers=["batch"])
    )


@pytest.mark.timeout(240)
async def test_one_tenants_cheap_requests_do_not_set_another_tenants_reservation(
    tiny_engine: VllmEngine, tiny_tokenizer_json: Path, gateway_client: GatewayClientFactory
) -> None:
    """Issue 18.4: 200 requests with max_tokens=1 from one tenant made another tenant's 16
    concurrent max_tokens=380 requests reserve ~7 tokens each instead of ~385: the engine
    ran 8 of them in 2,048 KV tokens and preempted."""
    client, gw = await gateway_client(
        _two_batch_tenants(tiny_engine, tiny_tokenizer_json), engine_poll_seconds=0.25
    )
    cheap = {"Authorization": "Bearer sk-cheap"}
    for _ in range(200):
        resp = await client.post(
            "/v1/completions", json=_completion("hello there", max_tokens=1), headers=cheap
        )
        assert resp.status == 200
        await resp.read()
    engine_before = await _engine_metrics(tiny_engine)
    before = gw.metrics.render().decode()

    async def victim() -> int:
        resp = await client.post(
            "/v1/completions",
            json=_completion("hello there", max_tokens=380, ignore_eos=True),
            headers={"Authorization": "Bearer sk-victim"},
        )
        await resp.read()
        return resp.status

    statuses = await asyncio.gather(*(victim() for _ in range(16)))

    after = gw.metrics.render().decode()
    engine_after = await _engine_metrics(tiny_engine)
    assert statuses == [200] * 16
    reserved = _sample(after, "kvpool_gateway_reserved_tokens_total") - _sample(
        before, "kvpool_gateway_reserved_tokens_total"
    )
    bound = _sample(after, "kvpool_gateway_bound_tokens_total") - _sample(
        before, "kvpool_gateway_bound_tokens_total"
    )
    preempted = _sample(engine_after, "vllm:num_preemptions_total") - _sample(
        engine_before, "vllm:num_preemptions_total"
    )
    assert reserved == bound, (
        f"the victim's 16 requests reserved {reserved / 16:.0f} tokens each of a bound of "
        f"{bound / 16:.0f} (preemptions {preempted:.0f})"
    )
    assert preempted == 0, f"{preempted:.0f} preemptions with full reservations"
