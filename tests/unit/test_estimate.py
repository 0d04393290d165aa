"""Estimate: exact or fallback prompt tokens, output reservation, rejections before any engine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.domain.estimate import (
    FALLBACK_BYTES_PER_TOKEN,
    REASON_INVALID_MAX_TOKENS,
    REASON_INVALID_N,
    REASON_MAX_TOKENS_TOO_LARGE,
    REASON_PROMPT_TOO_LONG,
    Estimate,
    EstimateRejected,
    PromptSize,
    decide_estimate,
    estimate_prompt_tokens,
)
from kvpool.gateway.outcomes import status_of
from tests.builders import CompiledPoolBuilder

# maxModelLen 4096, output p95 512, one replica of 16384 tokens / 16 slots
POOL = (
    CompiledPoolBuilder(max_model_len=4096, output_p95=512)
    .capacity(16384, 16)
    .replica_capacity(16384, 16)
    .obj()
)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(prompt_tokens=1000, max_tokens=300), Estimate(1000, 300, output_limit=300)),
        (
            dict(prompt_tokens=1000),
            Estimate(1000, 3096, output_source="context_bounded", output_limit=3096),
        ),
        (
            dict(prompt_tokens=3900),
            Estimate(3900, 196, output_source="context_bounded", output_limit=196),
        ),
        (dict(prompt_tokens=1000, max_tokens=2000), Estimate(1000, 2000, output_limit=2000)),
        (dict(prompt_tokens=1000, max_tokens=3096), Estimate(1000, 3096, output_limit=3096)),
        (
            dict(prompt_tokens=1000, max_tokens=3500),
            Estimate(1000, 3096, output_source="context_bounded", output_limit=3096),
        ),
        (
            dict(prompt_tokens=100, max_tokens=10, n=4),
            Estimate(400, 40, sequences=4, output_limit=10),
        ),
        (
            dict(prompts=[PromptSize(100), PromptSize(3000)], max_tokens=2000),
            Estimate(3100, 3096, sequences=2, output_source="context_bounded", output_limit=2000),
        ),
        (
            dict(prompts=[PromptSize(100), PromptSize(200)], max_tokens=10, n=3),
            Estimate(900, 60, sequences=6, output_limit=10),
        ),
        (
            dict(prompt_tokens=1000, max_tokens=4096, n=8),
            Estimate(
                8000,
                24768,
                sequences=8,
                output_source="context_bounded",
                output_limit=3096,
                reserve_tokens=16384,
            ),
        ),
        (
            dict(prompt_tokens=10, max_tokens=10, n=17),
            Estimate(170, 170, sequences=17, output_limit=10, reserve_slots=16),
        ),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=9000, max_tokens=200),
            Estimate(3000, 200, estimated=True, output_limit=200),
        ),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=300, messages=2, max_tokens=512),
            Estimate(116, 512, estimated=True, output_limit=512),
        ),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=12000, max_tokens=500),
            Estimate(4000, 96, estimated=True, output_source="context_bounded", output_limit=96),
        ),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=15000, max_tokens=10),
            Estimate(4095, 1, estimated=True, output_source="context_bounded", output_limit=1),
        ),
    ],
    ids=[
        "exact-with-max-tokens",
        "no-max-tokens-bounds-output-by-the-context",
        "no-max-tokens-long-prompt",
        "large-max-tokens-is-legitimate",
        "exactly-fills-context",
        "max-tokens-past-the-context-is-clamped-like-vllm",
        "n-sequences",
        "list-of-prompts-each-bounded-by-its-own-room",
        "list-of-prompts-times-n",
        "larger-than-a-replica-reserves-one-replica-charges-all",
        "n-over-replica-slots-reserves-all-slots",
        "fallback-3-bytes-a-token",
        "fallback-chat-message-overhead",
        "fallback-too-long-is-bounded-not-rejected",
        "fallback-keeps-one-output-token",
    ],
)
def test_estimate(kwargs, expected) -> None:
    assert decide_estimate(POOL, **kwargs) == expected


@pytest.mark.parametrize(
    ("kwargs", "reason", "status"),
    [
        (dict(prompt_tokens=10, max_tokens=0), REASON_INVALID_MAX_TOKENS, 400),
        (dict(prompt_tokens=10, max_tokens=-5), REASON_INVALID_MAX_TOKENS, 400),
        (dict(prompt_tokens=10, n=0), REASON_INVALID_N, 400),
        (dict(prompt_tokens=4096), REASON_PROMPT_TOO_LONG, 400),
        (dict(prompt_tokens=None, prompt_utf8_bytes=8 * 4096), REASON_PROMPT_TOO_LONG, 400),
        (dict(prompts=[PromptSize(10), PromptSize(5000)]), REASON_PROMPT_TOO_LONG, 400),
        (dict(prompt_tokens=10, max_tokens=4097), REASON_MAX_TOKENS_TOO_LARGE, 400),
    ],
    ids=[
        "max-tokens-zero",
        "max-tokens-negative",
        "n-zero",
        "prompt-fills-context",
        "fallback-lower-bound-too-long",
        "one-prompt-of-a-list-too-long",
        "max-tokens-over-the-whole-context",
    ],
)
def test_estimate_rejects(kwargs, reason, status) -> None:
    verdict = decide_estimate(POOL, **kwargs)
    assert isinstance(verdict, EstimateRejected)
    assert (verdict.reason, status_of(verdict.reason)) == (reason, status)
    assert verdict.message


def test_pool_without_capacity_figure_leaves_the_verdict_to_admission() -> None:
    pool = CompiledPoolBuilder().no_plan().replica_capacity(0, 0).obj()
    verdict = decide_estimate(pool, prompt_tokens=10, prompt_utf8_bytes=0, max_tokens=10)
    assert verdict == Estimate(10, 10, output_limit=10)


@given(
    prompt=st.one_of(st.none(), st.integers(min_value=0, max_value=6000)),
    utf8=st.integers(min_value=0, max_value=60000),
    max_tokens=st.one_of(st.none(), st.integers(min_value=-2, max_value=6000)),
    n=st.integers(min_value=0, max_value=20),
)
def test_estimate_charges_everything_the_engine_can_generate(prompt, utf8, max_tokens, n) -> None:
    verdict = decide_estimate(
        POOL, prompt_tokens=prompt, prompt_utf8_bytes=utf8, max_tokens=max_tokens, n=n
    )
    if isinstance(verdict, Estimate):
        per_prompt = verdict.prompt_tokens // n
        room = POOL.max_model_len - per_prompt
        engine_output = room if max_tokens is None else min(max_tokens, room)
        assert max_tokens is None or max_tokens <= POOL.max_model_len
        assert verdict.output_tokens == n * engine_output  # the engine's bound, in full
        assert verdict.output_limit == engine_output  # and the upstream max_tokens
        assert verdict.charge_tokens == n * (per_prompt + engine_output)
        assert verdict.tokens == min(verdict.charge_tokens, POOL.tokens_per_replica)
        assert verdict.slots == min(n, POOL.slots_per_replica)
    else:
        assert status_of(verdict.reason) == 400


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=100))
def test_fallback_estimate_is_monotonic(utf8, messages) -> None:
    low = estimate_prompt_tokens(utf8, messages)
    assert low >= utf8 / FALLBACK_BYTES_PER_TOKEN
    assert estimate_prompt_tokens(utf8 + 1, messages) >= low
    assert estimate_prompt_tokens(utf8, messages + 1) > low
