"""Estimate a request's KV reservation and budget charge from the engine's own rules.

Why this module exists: admission reserves KV tokens and budgets charge tokens *before*
the engine sees the request, so both must be known up front, must follow what the engine
will actually run (a gateway stricter than vLLM breaks clients; one looser than vLLM lets a
request shape generate more than it was charged for), and the few requests the engine
would refuse must be refused before any engine is touched.

**The engine's rules** (vLLM 0.32, ``get_max_tokens`` and the input processor):

- a prompt of ``max_model_len`` tokens or more is refused (400), and so is a
  ``max_tokens`` larger than ``max_model_len`` itself (400, whatever the prompt);
- the output of each sequence is ``min(max_tokens, max_model_len - prompt)``: a
  ``max_tokens`` past the room the prompt leaves is clamped to the context, not refused,
  and an absent one means "up to the end of the context" (``max_model_len - prompt``);
- ``/v1/completions`` without a ``max_tokens`` field generates at most 16 tokens (the
  OpenAI default; the parser applies it, see :mod:`kvpool.gateway.request`); an explicit
  ``null`` means the context bound;
- a list of prompts on ``/v1/completions`` is served, each prompt its own sequence(s);
  ``n`` sequences per prompt; ``max_tokens < 1`` or ``n < 1`` are refused (400).

**The charge** is the most the engine can generate: per prompt ``p``, ``n x (p + min(
max_tokens or room, room))``. Budgets charge it in full (so no request shape can generate
more than it was charged for); the gateway also sets ``max_tokens`` on the upstream
request to the per-sequence bound (:attr:`Estimate.output_limit`), so an inexact prompt
count (the byte fallback, or a tokenizer that differs from the engine's) cannot open the
gap either.

**The KV reservation** is what admission holds (:attr:`Estimate.tokens`/``slots``): the
charge, capped at one replica (a request larger than a replica still runs on the engine,
which preempts and resumes sequences; it then simply takes a whole replica, so the
gateway is no stricter than the engine). Admission may later reserve less than the bound
(a learned output quantile, see :mod:`kvpool.domain.admission`) - the charge never shrinks.

**Input tokens.** When the I/O layer has the pool's tokenizer it passes the exact count
(after the chat template). Otherwise the fallback estimate is ``ceil(utf8_bytes / 3) +
8 * messages``: BPE tokenizers average ~4 bytes a token on English text and ~2-3 on code or
other scripts, so 3 leans towards over-reservation; the per-message term covers template
markup. The estimate is flagged (``Estimate.estimated``). Because it can be wrong both
ways, a length refusal based on it uses a *lower bound*, ``ceil(utf8_bytes / 8)``: only a
prompt too long even then is refused; otherwise the engine has the final word. A long
prompt may also come sized by a learned upper bound instead of its exact count
(``PromptSize.bound``, :mod:`kvpool.domain.prompt_bound`): it is reserved as given,
flagged like the fallback, and refused by the same lower bound; its upstream
``max_tokens`` is the caller's own (or the room above the lower bound), never the room
above the bound, which would cut an output near the context short.

Worked example (maxModelLen 4096, one replica of 16384 tokens and 16 slots)::

    exact 1000 prompt, max_tokens 300      -> charge 1300, reserve 1300
    exact 1000 prompt, max_tokens None     -> output bound 3096 (to the context)
    exact 1000 prompt, max_tokens 3500     -> output bound 3096 (clamped like vLLM, no 400)
    exact 10 prompt, max_tokens 5000       -> EstimateRejected 400 max_tokens_too_large
    prompts [100, 3000], max_tokens 2000   -> outputs 2000 + 1096, charge 6196, 2 slots
    exact 1000 prompt, max_tokens 4000, n 8 -> charge 32768, reserve 16384 (one replica)
    exact 4096 prompt                      -> EstimateRejected 400 prompt_too_long
    9000 bytes, no tokenizer, max 200      -> prompt ~3000 (estimated), output 200
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvpool.api.admission_config import CompiledPool

FALLBACK_BYTES_PER_TOKEN = 3
FALLBACK_TOKENS_PER_MESSAGE = 8
FALLBACK_MAX_BYTES_PER_TOKEN = 8

REASON_INVALID_MAX_TOKENS = "invalid_max_tokens"
REASON_INVALID_N = "invalid_n"
REASON_PROMPT_TOO_LONG = "prompt_too_long"
REASON_MAX_TOKENS_TOO_LARGE = "max_tokens_too_large"

OutputSource = Literal["max_tokens", "context_bounded"]


@dataclass(frozen=True)
class PromptSize:
    """One prompt's size: the exact token count when known, else its UTF-8 length."""

    tokens: int | None  # exact count (tokenizer, chat template applied), or None
    utf8_bytes: int = 0  # UTF-8 length of the prompt text (all message contents for chat)
    messages: int = 0  # chat messages (0 for completions)
    bound: bool = False  # ``tokens`` is an upper bound (kvpool.domain.prompt_bound), not exact


@dataclass(frozen=True)
class Estimate:
    """A request's charge (what the engine can generate) and KV reservation.

    ``prompt_tokens``/``output_tokens`` are totals over all sequences; ``tokens`` and
    ``slots`` are what admission reserves; ``charge_tokens`` what budgets charge.
    """

    prompt_tokens: int  # prompt tokens held by all sequences (n per prompt)
    output_tokens: int  # the engine's output bound, summed over all sequences
    sequences: int = 1  # prompts x n: one slot each
    estimated: bool = False  # True when a prompt count is not exact (bytes or a bound)
    output_source: OutputSource = "max_tokens"  # context_bounded: the context clamps it
    output_limit: int = 0  # per-sequence max_tokens to set upstream (0: not computed)
    reserve_tokens: int | None = None  # KV reservation when below the charge (None: charge)
    borrow_tokens: int | None = None  # KV reservation above the tier's floor (None: tokens)
    reserve_slots: int | None = None  # slots when capped at one replica (None: sequences)

    @property
    def charge_tokens(self) -> int:
        """Tokens the budget charges at admission: prompt + everything the engine may generate."""
        return self.prompt_tokens + self.output_tokens

    @property
    def tokens(self) -> int:
        """KV tokens to reserve."""
        return self.charge_tokens if self.reserve_tokens is None else self.reserve_tokens

    @property
    def slots(self) -> int:
        """Running-batch places to reserve: one per sequence, at most one replica's."""
        return self.sequences if self.reserve_slots is None else self.reserve_slots


@dataclass(frozen=True)
class EstimateRejected:
    """The engine would refuse the request as sent (the gateway answers 400 for each reason)."""

    reason: str  # constant (REASON_*) for metrics and the JSON error code
    message: str  # client-facing explanation with the numbers


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
    prompt_tokens: int | None = None,
    prompt_utf8_bytes: int = 0,
    messages: int = 0,
    max_tokens: int | None = None,
    n: int = 1,
    prompts: Sequence[PromptSize] | None = None,
) -> EstimateVerdict:
    """The charge and reservation of one request against ``pool``; see the module docstring.

    One prompt is given by ``prompt_tokens`` (exact count or None), ``prompt_utf8_bytes``
    and ``messages``; several (a list of prompts on /v1/completions) by ``prompts``.
    ``max_tokens`` is the effective output limit the engine will see (None: up to the
    context); ``n`` the sequences per prompt. Type checks are the parser's job.
    """
    if max_tokens is not None and max_tokens < 1:
        return EstimateRejected(
            REASON_INVALID_MAX_TOKENS, f"max_tokens must be >= 1, got {max_tokens}"
        )
    if n < 1:
        return EstimateRejected(REASON_INVALID_N, f"n must be >= 1, got {n}")
    if max_tokens is not None and max_tokens > pool.max_model_len:
        return EstimateRejected(
            REASON_MAX_TOKENS_TOO_LARGE,
            f"max_tokens={max_tokens} cannot be greater than this model's maximum context "
            f"length of {pool.max_model_len} tokens",
        )
    sizes = (
        list(prompts)
        if prompts is not None
        else [PromptSize(prompt_tokens, prompt_utf8_bytes, messages)]
    )
    limit = pool.max_model_len
    total_prompt = total_output = 0
    estimated = False
    clamped = False
    widest = 1  # the largest per-sequence output bound (the upstream max_tokens)
    for index, size in enumerate(sizes):
        if size.tokens is None:
            estimated = True
            prompt = estimate_prompt_tokens(size.utf8_bytes, size.messages)
            certain = prompt_tokens_lower_bound(size.utf8_bytes)
        elif size.bound:  # at least what the engine will count: reserve it, refuse by bytes
            estimated = True
            prompt = max(0, size.tokens)
            certain = prompt_tokens_lower_bound(size.utf8_bytes)
        else:
            prompt = certain = max(0, size.tokens)
        if certain >= limit:
            which = f"prompt {index} " if len(sizes) > 1 else "prompt "
            return EstimateRejected(
                REASON_PROMPT_TOO_LONG,
                f"this model's maximum context length is {limit} tokens; the {which}has "
                f"{'at least ' if size.tokens is None else ''}{certain} tokens, which leaves "
                "no room for one output token",
            )
        # an estimated prompt may exceed the limit while its lower bound does not: keep one
        # output token and let the engine judge the real length
        prompt = min(prompt, limit - 1)
        room = limit - prompt
        output = room if max_tokens is None or max_tokens >= room else max_tokens
        clamped = clamped or (output == room and (max_tokens is None or max_tokens > room))
        # a bound over-states the prompt: the upstream cap must not cut the room the
        # engine leaves (the charge, prompt + output <= max_model_len, still covers it)
        widest = max(widest, output if not size.bound else max_tokens or limit - certain)
        total_prompt += n * prompt
        total_output += n * output
    sequences = n * len(sizes)
    estimate = Estimate(
        prompt_tokens=total_prompt,
        output_tokens=total_output,
        sequences=sequences,
        estimated=estimated,
        output_source="context_bounded" if clamped else "max_tokens",
        output_limit=widest,
    )
    cap_t, cap_s = pool.tokens_per_replica, pool.slots_per_replica
    if cap_t > 0 and cap_s > 0 and (estimate.tokens > cap_t or sequences > cap_s):
        # the engine serves it (preempting its own sequences); it takes a whole replica
        return Estimate(
            prompt_tokens=total_prompt,
            output_tokens=total_output,
            sequences=sequences,
            estimated=estimated,
            output_source=estimate.output_source,
            output_limit=widest,
            reserve_tokens=cap_t if estimate.tokens > cap_t else None,
            reserve_slots=cap_s if sequences > cap_s else None,
        )
    return estimate
