"""When a long prompt is sized by the learned bound, and what the bound is (table cases),
and how its estimate is reserved and refused."""

from __future__ import annotations

import pytest

from kvpool.api.admission_config import CompiledPool
from kvpool.domain.estimate import Estimate, EstimateRejected, PromptSize, decide_estimate
from kvpool.domain.prompt_bound import (
    LONG_PROMPT_BYTES,
    MIN_SAMPLES,
    RECOUNT_EVERY,
    SAMPLE_BYTES,
    SAMPLES,
    CountExactly,
    SizeByBound,
    TokenRatio,
    bound_tokens,
    decide_prompt_bound,
)
from tests.builders import AdmissionConfigBuilder


def _learned(*ratios: float) -> TokenRatio:
    ratio = TokenRatio()
    for value in ratios:
        ratio.observe(round(value * 100_000), 100_000)
    return ratio


@pytest.mark.parametrize(
    ("ratios", "since_count", "utf8_bytes", "expected"),
    [
        ([0.25] * MIN_SAMPLES, 0, LONG_PROMPT_BYTES, CountExactly("short")),
        ([0.25] * (MIN_SAMPLES - 1), 0, 400_000, CountExactly("learning")),
        ([0.25] * MIN_SAMPLES, 0, LONG_PROMPT_BYTES + 1, SizeByBound(0.25)),
        ([0.24, 0.26] + [0.25] * (MIN_SAMPLES - 2), 3, 400_000, SizeByBound(0.26)),
        ([0.25] * MIN_SAMPLES, RECOUNT_EVERY - 1, 400_000, CountExactly("recount")),
    ],
    ids=[
        "16-KiB-is-short-counted-exactly",
        "seven-samples-still-learning",
        "just-over-16-KiB-by-the-bound",
        "the-largest-ratio-kept-is-learned",
        "every-16th-long-prompt-recounted",
    ],
)
def test_which_prompts_are_sized_by_the_bound(
    ratios: list[float], since_count: int, utf8_bytes: int, expected: object
) -> None:
    ratio = _learned(*ratios)
    ratio.since_count = since_count
    assert decide_prompt_bound(ratio, utf8_bytes) == expected


def test_the_recount_cadence_counts_one_long_prompt_in_sixteen() -> None:
    ratio = _learned(*[0.25] * MIN_SAMPLES)
    verdicts = [decide_prompt_bound(ratio, 400_000) for _ in range(3 * RECOUNT_EVERY)]
    exact = [i for i, v in enumerate(verdicts) if isinstance(v, CountExactly)]
    assert exact == [RECOUNT_EVERY - 1, 2 * RECOUNT_EVERY - 1, 3 * RECOUNT_EVERY - 1]
    assert decide_prompt_bound(ratio, 1000) == CountExactly("short")  # short: no cadence


def test_short_counts_teach_nothing_and_old_samples_age_out() -> None:
    ratio = TokenRatio()
    for _ in range(MIN_SAMPLES):
        ratio.observe(300, SAMPLE_BYTES - 1)  # template markup dominates: not a sample
    assert ratio.learned is None
    ratio.observe(int(0.9 * 100_000), 100_000)  # one CJK prompt, long ago
    for _ in range(SAMPLES):
        ratio.observe(25_000, 100_000)
    assert ratio.learned == pytest.approx(0.25)  # the 0.9 is no longer among the kept


def test_an_engine_report_above_the_bound_raises_the_ratio() -> None:
    ratio = _learned(*[0.25] * MIN_SAMPLES)
    ratio.observe(40_000, 100_000)  # the engine counted more than the bound assumed
    assert ratio.learned == pytest.approx(0.40)


@pytest.mark.parametrize(
    ("learned", "sample_tokens", "sample_bytes", "utf8_bytes", "messages", "expected"),
    [
        (0.25, 1000, 4000, 400_000, 1, 105_008),  # sample like the traffic
        (0.25, 900, 4000, 400_000, 0, 105_000),  # sample below: the learned ratio holds
        (0.25, 1800, 4000, 400_000, 1, 189_008),  # CJK after English: its own sample
        (0.25, 0, 0, 20_000, 3, 5_274),  # no sample text (all in other parts)
    ],
    ids=["like-the-traffic", "learned-holds", "own-sample-higher", "no-sample"],
)
def test_the_bound(
    learned: float,
    sample_tokens: int,
    sample_bytes: int,
    utf8_bytes: int,
    messages: int,
    expected: int,
) -> None:
    assert bound_tokens(learned, sample_tokens, sample_bytes, utf8_bytes, messages) == expected


def _pool(max_model_len: int = 4096) -> CompiledPool:
    return (
        AdmissionConfigBuilder()
        .tier("interactive", 50)
        .pool("m", ["http://127.0.0.1:9"], max_model_len=max_model_len, tokens_per_replica=1 << 20)
        .obj()
        .pools[0]
    )


def test_a_bound_prompt_is_reserved_as_given_and_refused_only_by_its_bytes() -> None:
    pool = _pool(131_072)
    bound = PromptSize(105_008, 400_000, 1, bound=True)
    verdict = decide_estimate(pool, prompts=[bound], max_tokens=2000)
    assert verdict == Estimate(105_008, 2000, estimated=True, output_limit=2000)
    # a bound past the context is not a refusal: the bytes' lower bound (50k) fits
    past = decide_estimate(pool, prompts=[PromptSize(140_000, 400_000, 1, bound=True)])
    assert isinstance(past, Estimate) and past.prompt_tokens == 131_071
    # the bytes alone prove it too long: refused, as with the byte fallback
    huge = decide_estimate(pool, prompts=[PromptSize(300_000, 1_100_000, 1, bound=True)])
    assert isinstance(huge, EstimateRejected) and huge.reason == "prompt_too_long"


@pytest.mark.parametrize(
    ("max_tokens", "output", "output_limit"),
    [(None, 26_064, 81_072), (30_000, 26_064, 30_000), (2000, 2000, 2000)],
    ids=["to-the-context", "clamped-by-the-bound", "within-the-room"],
)
def test_the_upstream_cap_of_a_bound_prompt_never_cuts_the_engines_room(
    max_tokens: int | None, output: int, output_limit: int
) -> None:
    # 400 KB whose bound is 105,008 tokens: the reservation's output is the room above
    # the bound, the upstream cap what the engine could allow above the bytes' lower bound
    pool = _pool(131_072)
    verdict = decide_estimate(
        pool, prompts=[PromptSize(105_008, 400_000, 1, bound=True)], max_tokens=max_tokens
    )
    assert isinstance(verdict, Estimate)
    assert verdict.output_tokens == output
    assert verdict.output_limit == output_limit
    assert verdict.charge_tokens <= pool.max_model_len  # prompt + output still within context
