"""Size a long prompt by a learned bound on its tokens per byte instead of tokenizing it whole.

Why this module exists: admission needs a prompt's tokens before the engine sees it, and
the exact count of a long prompt is the most expensive thing the gateway does per request
(issue 19: a 100k-token prompt cost kvpool ~50 ms of CPU, twenty times what vllm-router
spends proxying it; tokenization was most of it). Admission does not need the exact
count: it needs a figure that is not *below* what the engine will count (a short
reservation lets the engine preempt), and not far above it (an inflated one leaves KV idle).

The rule (:func:`decide_prompt_bound`, pure; :class:`TokenRatio` holds what it learned):

- a prompt of at most ``LONG_PROMPT_BYTES`` (16 KiB, ~4k tokens of English) is counted
  exactly: that costs about a millisecond, and short prompts are where a few tokens of
  error matter most;
- exact counts of prompts of at least ``SAMPLE_BYTES`` teach the pool's ratio (tokens per
  UTF-8 byte; shorter ones are dominated by the chat template's markup). The last
  ``SAMPLES`` (32) are kept; their *largest* is the learned ratio;
- a long prompt is counted exactly until ``MIN_SAMPLES`` (8) ratios are known, and then
  still every ``RECOUNT_EVERY``-th (16th) long prompt, so the ratio follows the traffic;
- otherwise its bound is ``ceil(bytes x max(learned, its own sample) x MARGIN)`` plus
  ``TEMPLATE_TOKENS_PER_MESSAGE`` a message, where its own sample is the ratio of its first
  and last ``SAMPLE_BYTES / 2`` characters, tokenized (~0.5 ms; the ratio is over the
  sample's UTF-8 bytes): a prompt unlike the traffic
  the ratio was learned from (code or CJK after English prose) is caught by its sample,
  not sized by someone else's text. ``MARGIN`` (1.05) covers the spread of ratios within
  a text;
- when the engine reports the prompt tokens of a request sized by the bound, the report
  is a sample too (:meth:`TokenRatio.observe`): a bound found short raises the ratio for
  the next request.

Worked example (ratios learned 0.24-0.26 tokens a byte, 400 KB single-message chat)::

    sample 0.25 -> ceil(400000 x 0.26 x 1.05) + 8 = 109208 tokens (exact: ~100000)
    sample 0.45 (CJK) -> ceil(400000 x 0.45 x 1.05) + 8 = 189008 tokens
    12 KB prompt -> counted exactly (short)
    the 16th long prompt since the last count -> counted exactly (recount)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kvpool.domain.estimate import FALLBACK_TOKENS_PER_MESSAGE

LONG_PROMPT_BYTES = 16 * 1024  # longer prompts may be sized by the bound
SAMPLE_BYTES = 4 * 1024  # exact counts of prompts this long teach the ratio; own sample size
SAMPLES = 32  # ratios kept
MIN_SAMPLES = 8  # ratios needed before a long prompt is sized by the bound
RECOUNT_EVERY = 16  # every so many long prompts, one is counted exactly
MARGIN = 1.05  # over the largest ratio seen
# chat markup a message adds (role, separators): the byte fallback's own figure
TEMPLATE_TOKENS_PER_MESSAGE = FALLBACK_TOKENS_PER_MESSAGE


@dataclass
class TokenRatio:
    """What one pool's exact counts taught about its prompts' tokens per byte."""

    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    since_count: int = 0  # long prompts sized by the bound since the last exact count

    def observe(self, tokens: int, utf8_bytes: int) -> None:
        """An exact count (the tokenizer's, or the engine's report) of a prompt."""
        if utf8_bytes >= SAMPLE_BYTES and tokens > 0:
            self.ratios.append(tokens / utf8_bytes)

    @property
    def learned(self) -> float | None:
        """The largest ratio kept, once ``MIN_SAMPLES`` are known."""
        return max(self.ratios) if len(self.ratios) >= MIN_SAMPLES else None


@dataclass(frozen=True)
class CountExactly:
    """The prompt is to be tokenized whole."""

    reason: str  # short | learning | recount


@dataclass(frozen=True)
class SizeByBound:
    """The prompt is sized by the bound, from the ratio of a sample of it."""

    learned: float  # the pool's learned ratio


PromptSizing = CountExactly | SizeByBound


def decide_prompt_bound(ratio: TokenRatio, utf8_bytes: int) -> PromptSizing:
    """Whether a prompt of ``utf8_bytes`` is counted exactly or sized by the bound.

    A decision for a long prompt advances the recount cadence (``ratio.since_count``).
    """
    if utf8_bytes <= LONG_PROMPT_BYTES:
        return CountExactly("short")
    learned = ratio.learned
    if learned is None:
        return CountExactly("learning")
    if ratio.since_count + 1 >= RECOUNT_EVERY:
        ratio.since_count = 0
        return CountExactly("recount")
    ratio.since_count += 1
    return SizeByBound(learned)


def bound_tokens(
    learned: float, sample_tokens: int, sample_bytes: int, utf8_bytes: int, messages: int = 0
) -> int:
    """The bound of a prompt of ``utf8_bytes`` (``messages`` chat messages), whose sample
    of ``sample_bytes`` has ``sample_tokens`` tokens.

    >>> bound_tokens(0.26, 1000, 4000, 400_000, messages=1)
    109208
    >>> bound_tokens(0.26, 1800, 4000, 400_000, messages=1)
    189008
    """
    own = sample_tokens / sample_bytes if sample_bytes > 0 else 0.0
    return math.ceil(utf8_bytes * max(learned, own) * MARGIN) + (
        TEMPLATE_TOKENS_PER_MESSAGE * messages
    )
