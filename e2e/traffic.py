"""The demo's load generator: a steady interactive chat tenant and a flooding batch tenant.

Why this module exists: the product's point is what happens to each tier when both send
at once, so the load must look like the two real workloads - open-loop Poisson arrivals
(a client that slows down when the server is slow would hide the queueing we want to
see), distinct random prompts (identical prompts would share KV blocks through the
engine's prefix cache and hide the contention), and streaming answers so the client can
measure time to first token (TTFT) itself.

Two traffic classes (:class:`TrafficClass`), one per tenant:

- interactive: ``POST /v1/chat/completions``, ~12-word questions (~30 tokens with the
  tiny model's tokenizer, plus the chat template), ``max_tokens`` 32;
- batch: ``POST /v1/completions``, ~65-word documents (~170 tokens, at most ~220),
  ``max_tokens`` 200 (``ignore_eos`` so every request really generates them): ~370 KV
  tokens each, five of them fill the tiny engine's 2048-token KV cache.

Each request yields a :class:`~e2e.report.RequestRecord`; nothing here decides anything.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from e2e.report import RequestRecord

WORDS = (
    "the",
    "a",
    "model",
    "pool",
    "token",
    "cache",
    "engine",
    "request",
    "batch",
    "summary",
    "report",
    "quarterly",
    "revenue",
    "customer",
    "support",
    "ticket",
    "answer",
    "question",
    "latency",
    "throughput",
    "memory",
    "budget",
    "tenant",
    "priority",
    "queue",
    "capacity",
    "floor",
    "borrow",
    "lend",
    "plan",
    "measure",
    "cluster",
    "node",
    "replica",
    "rollout",
    "canary",
    "stable",
    "version",
    "invoice",
    "order",
    "shipment",
    "delay",
    "refund",
    "account",
    "password",
    "reset",
)
DRAIN_SECONDS = 60.0  # how long in-flight requests may finish after the last arrival


@dataclass(frozen=True)
class TrafficClass:
    """One tenant's traffic: where it goes, how often, and how long its requests are."""

    tier: str  # the tier these requests should be classified into (for the report)
    api_key: str  # the tenant's API key (Authorization: Bearer)
    path: str  # /v1/chat/completions or /v1/completions
    rate: float  # mean arrivals per second (Poisson)
    prompt_words: tuple[int, int]  # inclusive range of words per prompt
    max_tokens: int  # output tokens asked for
    ignore_eos: bool = False  # generate exactly max_tokens (the tiny model stops at random)


def build_interactive(api_key: str, rate: float) -> TrafficClass:
    """The chat product: short questions, short streamed answers."""
    return TrafficClass(
        tier="interactive",
        api_key=api_key,
        path="/v1/chat/completions",
        rate=rate,
        prompt_words=(8, 16),
        max_tokens=32,
    )


def build_batch(api_key: str, rate: float) -> TrafficClass:
    """The bulk summariser: long documents, long outputs, far more than the pool holds."""
    return TrafficClass(
        tier="batch",
        api_key=api_key,
        path="/v1/completions",
        rate=rate,
        prompt_words=(60, 72),
        max_tokens=200,
        ignore_eos=True,
    )


def build_body(traffic: TrafficClass, model: str, rng: random.Random) -> dict[str, Any]:
    """A request body with a fresh random prompt (streaming, usage included)."""
    words = rng.randint(*traffic.prompt_words)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": traffic.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if traffic.path.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = f"Summarise: {text}\nSummary:"
    if traffic.ignore_eos:
        body["ignore_eos"] = True
    return body


def _has_token(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content"):
            return True
    return False


def _error_code(raw: bytes) -> str | None:
    try:
        error = json.loads(raw).get("error") or {}
    except (ValueError, AttributeError):
        return None
    code = error.get("code") or error.get("type")
    return str(code) if code else None


async def send_request(
    session: aiohttp.ClientSession, base_url: str, traffic: TrafficClass, body: dict[str, Any]
) -> RequestRecord:
    """Send one streaming request and time it; never raises for a server-side failure."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {traffic.api_key}"}
    ttft: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    try:
        async with session.post(base_url + traffic.path, json=body, headers=headers) as resp:
            if resp.status != 200:
                code = _error_code(await resp.read())
                return RequestRecord(
                    traffic.tier, resp.status, None, time.monotonic() - started, 0, code
                )
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if _has_token(event):
                    chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - started
                if event.get("usage"):
                    usage_tokens = int(event["usage"].get("completion_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return RequestRecord(
            traffic.tier, 0, ttft, time.monotonic() - started, 0, type(exc).__name__
        )
    tokens = usage_tokens if usage_tokens is not None else chunks
    return RequestRecord(traffic.tier, 200, ttft, time.monotonic() - started, tokens)


async def measure_saturated_rate(
    base_url: str, model: str, traffic: TrafficClass, requests: int = 8, seed: int = 3
) -> float:
    """Requests per second one engine completes when ``requests`` of ``traffic`` arrive at
    once (sent straight to it): what "more than the pool holds" means on this machine now.

    Example: 8 batch requests finishing together after 4.0 s -> 2.0 requests/s.
    """
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        records = await asyncio.gather(
            *(
                send_request(session, base_url, traffic, build_body(traffic, model, rng))
                for _ in range(requests)
            )
        )
        elapsed = time.monotonic() - started
    served = sum(1 for r in records if r.status == 200)
    if served == 0:
        raise RuntimeError(f"calibration: the engine at {base_url} served none of {requests}")
    return served / elapsed


async def _arrivals(
    session: aiohttp.ClientSession,
    base_urls: Sequence[str],
    model: str,
    traffic: TrafficClass,
    until: float,
    rng: random.Random,
    started: list[tuple[str, asyncio.Task[RequestRecord]]],
) -> None:
    """Start requests at Poisson arrival times until the deadline (open loop), spreading
    them over ``base_urls`` in turn."""
    next_at = time.monotonic() + rng.expovariate(traffic.rate)
    turn = 0
    while next_at < until:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        body = build_body(traffic, model, rng)
        url = base_urls[turn % len(base_urls)]
        turn += 1
        task = asyncio.create_task(send_request(session, url, traffic, body))
        started.append((traffic.tier, task))
        next_at += rng.expovariate(traffic.rate)


async def drive_traffic(
    base_urls: Sequence[str],
    model: str,
    classes: Sequence[TrafficClass],
    duration: float,
    seed: int = 7,
    drain_seconds: float = DRAIN_SECONDS,
) -> list[RequestRecord]:
    """Run every traffic class for ``duration`` seconds, then let in-flight requests end.

    ``base_urls``: one gateway, or (for the baseline without kvpool) the engines themselves,
    used in turn. Requests still running ``drain_seconds`` after the last arrival are
    cancelled (the engine aborts them) and recorded as failures (status 0, ``Unfinished``).
    """
    seeds = random.Random(seed)
    started: list[tuple[str, asyncio.Task[RequestRecord]]] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=duration + drain_seconds + 30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        until = time.monotonic() + duration
        await asyncio.gather(
            *(
                _arrivals(
                    session, base_urls, model, c, until, random.Random(seeds.random()), started
                )
                for c in classes
            )
        )
        if started:
            await asyncio.wait([task for _, task in started], timeout=drain_seconds)
        records = []
        for tier, task in started:
            if task.done():
                records.append(task.result())
            else:
                task.cancel()
                records.append(RequestRecord(tier, 0, None, duration, 0, "Unfinished"))
        await asyncio.gather(*(task for _, task in started), return_exceptions=True)
    return records
