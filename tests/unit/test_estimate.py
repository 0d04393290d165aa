"""Estimate: exact or fallback prompt tokens, output reservation, rejections before any engine."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.domain.estimate import (
    FALLBACK_BYTES_PER_TOKEN,
    REASON_CONTEXT_LENGTH,
    REASON_INVALID_MAX_TOKENS,
    REASON_INVALID_N,
    REASON_PROMPT_TOO_LONG,
    REASON_TOO_LARGE,
    Estimate,
    EstimateRejected,
    decide_estimate,
    estimate_prompt_tokens,
)
from tests.support.admission_builders import PoolBuilder

# maxModelLen 4096, output p95 512, one replica of 16384 tokens / 16 slots
POOL = (
    PoolBuilder(max_model_len=4096, output_p95=512)
    .capacity(16384, 16)
    .replica_capacity(16384, 16)
    .obj()
)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(prompt_tokens=1000, max_tokens=300), Estimate(1000, 300)),
        (dict(prompt_tokens=1000), Estimate(1000, 512, output_source="p95_default")),
        (dict(prompt_tokens=3900), Estimate(3900, 196, output_source="context_bounded")),
        (dict(prompt_tokens=1000, max_tokens=2000), Estimate(1000, 2000)),
        (dict(prompt_tokens=1000, max_tokens=3096), Estimate(1000, 3096)),
        (dict(prompt_tokens=100, max_tokens=10, n=4), Estimate(100, 10, sequences=4)),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=9000, max_tokens=200),
            Estimate(3000, 200, estimated=True),
        ),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=300, messages=2),
            Estimate(116, 512, estimated=True, output_source="p95_default"),
        ),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=12000, max_tokens=500),
            Estimate(4000, 96, estimated=True, output_source="context_bounded"),
        ),
        (
            dict(prompt_tokens=None, prompt_utf8_bytes=15000, max_tokens=10),
            Estimate(4095, 1, estimated=True, output_source="context_bounded"),
        ),
    ],
    ids=[
        "exact-with-max-tokens",
        "no-max-tokens-reserves-p95",
        "p95-bounded-by-context",
        "above-p95-is-legitimate",
        "exactly-fills-context",
        "n-sequences",
        "fallback-3-bytes-a-token",
        "fallback-chat-message-overhead",
        "fallback-too-long-is-bounded-not-rejected",
        "fallback-keeps-one-output-token",
    ],
)
def test_estimate(kwargs, expected) -> None:
    kwargs.setdefault("prompt_utf8_bytes", 0)
    assert decide_estimate(POOL, **kwargs) == expected


@pytest.mark.parametrize(
    ("kwargs", "reason", "status"),
    [
        (dict(prompt_tokens=10, max_tokens=0), REASON_INVALID_MAX_TOKENS, 400),
        (dict(prompt_tokens=10, max_tokens=-5), REASON_INVALID_MAX_TOKENS, 400),
        (dict(prompt_tokens=10, n=0), REASON_INVALID_N, 400),
        (dict(prompt_tokens=4096), REASON_PROMPT_TOO_LONG, 400),
        (dict(prompt_tokens=None, prompt_utf8_bytes=8 * 4096), REASON_PROMPT_TOO_LONG, 400),
        (dict(prompt_tokens=1000, max_tokens=3097), REASON_CONTEXT_LENGTH, 400),
        (dict(prompt_tokens=100, max_tokens=400, n=64), REASON_TOO_LARGE, 413),
        (dict(prompt_tokens=10, max_tokens=10, n=17), REASON_TOO_LARGE, 413),
    ],
    ids=[
        "max-tokens-zero",
        "max-tokens-negative",
        "n-zero",
        "prompt-fills-context",
        "fallback-lower-bound-too-long",
        "prompt-plus-output-over-context",
        "n-times-size-over-one-replica",
        "n-over-replica-slots",
    ],
)
def test_estimate_rejects(kwargs, reason, status) -> None:
    kwargs.setdefault("prompt_utf8_bytes", 0)
    verdict = decide_estimate(POOL, **kwargs)
    assert isinstance(verdict, EstimateRejected)
    assert (verdict.reason, verdict.http_status) == (reason, status)
    assert verdict.message


def test_pool_without_capacity_figure_leaves_the_verdict_to_admission() -> None:
    pool = PoolBuilder().no_plan().replica_capacity(0, 0).obj()
    verdict = decide_estimate(pool, prompt_tokens=10, prompt_utf8_bytes=0, max_tokens=10)
    assert verdict == Estimate(10, 10)


@given(
    prompt=st.one_of(st.none(), st.integers(min_value=0, max_value=6000)),
    utf8=st.integers(min_value=0, max_value=60000),
    max_tokens=st.one_of(st.none(), st.integers(min_value=-2, max_value=6000)),
    n=st.integers(min_value=0, max_value=20),
)
def test_estimate_never_reserves_past_the_context_or_a_replica(prompt, utf8, max_tokens, n) -> None:
    verdict = decide_estimate(
        POOL, prompt_tokens=prompt, prompt_utf8_bytes=utf8, max_tokens=max_tokens, n=n
    )
    if isinstance(verdict, Estimate):
        assert verdict.prompt_tokens + verdict.output_tokens <= POOL.max_model_len
        assert verdict.output_tokens >= 1
        assert verdict.tokens <= POOL.tokens_per_replica
        assert verdict.slots == n <= POOL.slots_per_replica
        if max_tokens is not None and not verdict.estimated:
            assert verdict.output_tokens == max_tokens  # never silently capped
    else:
        assert verdict.http_status in (400, 413)


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=100))
def test_fallback_estimate_is_monotonic(utf8, messages) -> None:
    low = estimate_prompt_tokens(utf8, messages)
    assert low >= utf8 / FALLBACK_BYTES_PER_TOKEN
    assert estimate_prompt_tokens(utf8 + 1, messages) >= low
    assert estimate_prompt_tokens(utf8, messages + 1) > low
