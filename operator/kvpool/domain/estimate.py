"""Estimate a request's KV reservation (prompt + output tokens, one slot per sequence).

Why this module exists: admission reserves KV tokens *before* the engine sees the request,
so the reservation must be known up front, be honest (an under-reservation overloads an
engine, an over-reservation wastes capacity) and reject what can never run before any
engine is touched.

**Input tokens.** When the I/O layer has the pool's tokenizer it passes the exact count
(``prompt_tokens``, after the chat template). Otherwise the fallback estimate is
``ceil(utf8_bytes / FALLBACK_BYTES_PER_TOKEN) + FALLBACK_TOKENS_PER_MESSAGE * messages``
with 3 bytes a token: BPE tokenizers average ~4 bytes a token on English text and ~2-3 on
code or other scripts, so 3 leans towards over-reservation (safe) without doubling it;
the per-message term covers chat-template markup. The estimate is flagged
(``Estimate.estimated``) so the server can count it in metrics. Because an estimate can be
wrong both ways, a length rejection based on it uses a *lower bound*,
``ceil(utf8_bytes / FALLBACK_MAX_BYTES_PER_TOKEN)`` (8 bytes a token): only a prompt that
is too long even then is rejected; otherwise the engine has the final word.

**Output reservation.** ``max_tokens`` is what the client may receive, so it is reserved
in full - a request explicitly asking for more than the pool's output p95 is legitimate
and is *not* capped (capping would under-reserve exactly the long requests that fill the
KV cache). When ``max_tokens`` is absent, the engine may generate up to the remaining
context; we reserve the pool's output p95 bounded by the remaining context (the settle at
the end corrects the estimate-error metric; the ~5% of longer outputs are absorbed by the
engine's own headroom).

**Rejections (before touching an engine)**, with HTTP status suggestions:

- ``max_tokens < 1``: 400 ``invalid_max_tokens``;
- ``n < 1``: 400 ``invalid_n``;
- prompt alone >= ``max_model_len``: 400 ``prompt_too_long`` (no room for one token);
- prompt + ``max_tokens`` > ``max_model_len``: 400 ``context_length_exceeded`` (vLLM would
  reject it the same way) - with an exact count; with an estimated count the output is
  instead reserved as ``min(max_tokens, max_model_len - prompt)`` and not rejected;
- the whole reservation (``n * (prompt + output)``) larger than one replica's KV tokens,
  or ``n`` larger than one replica's slots: 413 ``too_large_for_replica``. This is the
  documented bound on "unusually large outputs": a sequence cannot span replicas, so such
  a request could never start. (Fitting the *pool plan* is admission's job.)

Worked example (maxModelLen 4096, output p95 512, 16384 tokens per replica)::

    exact 1000 prompt, max_tokens 300      -> Estimate(1000, 300)  tokens 1300
    exact 1000 prompt, max_tokens None     -> Estimate(1000, 512)  (p95 default)
    exact 3900 prompt, max_tokens None     -> Estimate(3900, 196)  (context bounded)
    exact 1000 prompt, max_tokens 2000     -> Estimate(1000, 2000) (above p95: legitimate)
    exact 1000 prompt, max_tokens 3500     -> EstimateRejected 400 context_length_exceeded
    9000 bytes, no tokenizer, max 200      -> Estimate(3000, 200, estimated=True)
    exact 100 prompt, max 400, n 64        -> EstimateRejected 413 (64 x 500 > 16384)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvpool.api.admission_config import CompiledPool

FALLBACK_BYTES_PER_TOKEN = 3
FALLBACK_TOKENS_PER_MESSAGE = 8
FALLBACK_MAX_BYTES_PER_TOKEN = 8

BAD_REQUEST = 400
PAYLOAD_TOO_LARGE = 413

REASON_INVALID_MAX_TOKENS = "invalid_max_tokens"
REASON_INVALID_N = "invalid_n"
REASON_PROMPT_TOO_LONG = "prompt_too_long"
REASON_CONTEXT_LENGTH = "context_length_exceeded"
REASON_TOO_LARGE = "too_large_for_replica"

OutputSource = Literal["max_tokens", "p95_default", "context_bounded"]


@dataclass(frozen=True)
class Estimate:
    """A request's reservation. ``tokens``/``slots`` are what admission reserves."""

    prompt_tokens: int  # per sequence (exact or fallback estimate)
    output_tokens: int  # reserved output tokens per sequence
    sequences: int = 1  # the OpenAI ``n``: one slot each
    estimated: bool = False  # True when prompt_tokens is the byte-based fallback
    output_source: OutputSource = "max_tokens"  # where output_tokens came from

    @property
    def tokens(self) -> int:
        """KV tokens to reserve: every sequence holds its prompt and its output."""
        return self.sequences * (self.prompt_tokens + self.output_tokens)

    @property
    def slots(self) -> int:
        """Running-batch places: one per sequence."""
        return self.sequences


@dataclass(frozen=True)
class EstimateRejected:
    """The request can never run as sent; answer ``http_status`` with ``message``."""

    reason: str  # constant (REASON_*) for metrics and the JSON error code
    message: str  # client-facing explanation with the numbers
    http_status: int  # 400 or 413


EstimateVerdict = Estimate | EstimateRejected


def estimate_prompt_tokens(utf8_bytes: int, messages: int = 0) -> int:
    """The fallback prompt estimate (no tokenizer): 3 bytes a token + 8 per chat message.

    >>> estimate_prompt_tokens(9000)
    3000
    >>> estimate_prompt_tokens(10, messages=2)
    20
    """
    if utf8_bytes < 0 or messages < 0:
        raise ValueError("utf8_bytes and messages must be >= 0")
    return -(-utf8_bytes // FALLBACK_BYTES_PER_TOKEN) + FALLBACK_TOKENS_PER_MESSAGE * messages


def prompt_tokens_lower_bound(utf8_bytes: int) -> int:
    """A prompt certainly has at least this many tokens (8 bytes a token at most).

    >>> prompt_tokens_lower_bound(17)
    3
    """
    return -(-max(0, utf8_bytes) // FALLBACK_MAX_BYTES_PER_TOKEN)


def decide_estimate(
    pool: CompiledPool,
    *,
    prompt_tokens: int | None,
    prompt_utf8_bytes: int,
    messages: int = 0,
    max_tokens: int | None = None,
    n: int = 1,
) -> EstimateVerdict:
    """The reservation of one request against ``pool``; see the module docstring.

    ``prompt_tokens`` is the exact count from the pool's tokenizer (chat template applied)
    or None; ``prompt_utf8_bytes`` the UTF-8 length of the prompt text (all message
    contents for chat); ``messages`` the number of chat messages (0 for completions);
    ``max_tokens`` the client's ``max_tokens``/``max_completion_tokens`` (None if absent);
    ``n`` the number of sequences. Type checks (ints, not bools) are the server's job.
    """
    if max_tokens is not None and max_tokens < 1:
        return EstimateRejected(
            REASON_INVALID_MAX_TOKENS, f"max_tokens must be >= 1, got {max_tokens}", BAD_REQUEST
        )
    if n < 1:
        return EstimateRejected(REASON_INVALID_N, f"n must be >= 1, got {n}", BAD_REQUEST)
    limit = pool.max_model_len
    estimated = prompt_tokens is None
    if prompt_tokens is None:
        prompt = estimate_prompt_tokens(prompt_utf8_bytes, messages)
        certain = prompt_tokens_lower_bound(prompt_utf8_bytes)
    else:
        prompt = certain = max(0, prompt_tokens)
    if certain >= limit:
        return EstimateRejected(
            REASON_PROMPT_TOO_LONG,
            f"the prompt has {'at least ' if estimated else ''}{certain} tokens; "
            f"this model's maximum context length is {limit} tokens",
            BAD_REQUEST,
        )
    # An estimated prompt may exceed the limit while its lower bound does not: keep at least
    # one output token and let the engine judge the real length.
    prompt = min(prompt, limit - 1)
    room = limit - prompt
    source: OutputSource
    if max_tokens is None:
        output = min(pool.output_tokens_p95, room)
        source = "p95_default" if output == pool.output_tokens_p95 else "context_bounded"
    elif max_tokens <= room:
        output, source = max_tokens, "max_tokens"
    elif estimated:
        output, source = room, "context_bounded"
    else:
        return EstimateRejected(
            REASON_CONTEXT_LENGTH,
            f"this model's maximum context length is {limit} tokens; the prompt has "
            f"{prompt} tokens and max_tokens asks for {max_tokens} more",
            BAD_REQUEST,
        )
    output = max(1, output)
    estimate = Estimate(
        prompt_tokens=prompt,
        output_tokens=output,
        sequences=n,
        estimated=estimated,
        output_source=source,
    )
    if pool.tokens_per_replica <= 0 or pool.slots_per_replica <= 0:
        return estimate  # no capacity figure: admission answers (503 no plan)
    if estimate.tokens > pool.tokens_per_replica or n > pool.slots_per_replica:
        return EstimateRejected(
            REASON_TOO_LARGE,
            f"the request needs {estimate.tokens} KV tokens and {n} sequence slot(s); one "
            f"replica of this model holds {pool.tokens_per_replica} tokens and "
            f"{pool.slots_per_replica} sequences: lower max_tokens, n or the prompt",
            PAYLOAD_TOO_LARGE,
        )
    return estimate
