"""Parse, template and tokenize request bodies off the event loop, within bounds.

Why this module exists: one authenticated body under the size cap used to stall every
request of the process. A 7.5 MiB chat body was parsed, run through the chat template and
tokenized on the event loop: ``/healthz`` blocked for 26 s with four of them, and the
gateway's RSS went from 65 MiB to 887 MiB (tests/integration/test_gateway_body.py; now
p99 under 100 ms and a peak under 200 MiB). Here:

- **bound before reading**: no token stands for more than ``B`` UTF-8 bytes (``B``: the
  longest token of the pool's tokenizer), so no prompt the model can take is longer than
  ``max_model_len * B`` bytes, nor its JSON longer than 6 times that (a control character
  is escaped in six bytes). With 1 MiB for the other fields, a body larger than that for
  every pool of the config is refused with 413 from its ``Content-Length`` (or as soon as
  that much has arrived), before it is read or parsed. (Tiny model, 512 tokens: 1.03 MiB;
  a 128k-token model with 128-byte tokens: ~96 MiB, so ``--max-body-bytes``, 8 MiB, is
  the bound.)
- **bound before tokenizing**: a prompt longer than ``max_model_len * B`` UTF-8 bytes,
  where ``B`` is the longest token of the pool's tokenizer in bytes, cannot fit the model
  whatever it says (no token covers more than ``B`` bytes), so it is neither templated nor
  tokenized: the estimate gets no count and works from the byte length (with the usual
  vocabularies its byte bound rejects such a prompt with 400, as the engine would);
- **off the loop**: JSON parsing runs on a worker thread (``parse_workers``, 1: parsing
  holds the GIL, so one at a time leaves the loop its share; 2 measured worse), chat
  templates and tokenization on another pool (``tokenize_workers``, 2). The pools' sizes
  bound the memory of concurrent work (at most that many bodies in the tokenizer), and
  the loop only awaits their results;
- **small bodies inline**: a body of at most ``inline_bytes`` (8 KiB) is parsed, and a
  prompt of at most that many bytes templated and tokenized, on the loop itself: that
  costs well under a millisecond, while each hand-off to a worker thread waits for the GIL
  the loop holds - up to Python's 5 ms switch interval while the loop relays streams -
  which added milliseconds to every interactive first token;
- **tokenizer loads**: a request whose pool's tokenizer is still loading waits for it
  at most ``load_wait_seconds`` (2 s), then counts by the byte estimate; a tokenizer that
  cannot load (:mod:`kvpool.adapters.tokenizer`: FIFO, device, too large, hung volume)
  never blocks a request for longer;
- **time bound**: a count that does not finish within ``tokenize_seconds`` (5 s, queueing
  included) is abandoned for the byte-based fallback estimate (the request goes on; the
  worker finishes in the background). Parsing, which cannot fall back, is bounded by
  ``parse_seconds`` (10 s; then 503 ``body_timeout`` with Retry-After);
- **long prompts by a bound**: once the pool's exact counts have taught it its tokens per
  byte, a prompt over 16 KiB is sized by a learned upper bound from a 4 KiB sample of it
  instead of being tokenized whole (:mod:`kvpool.domain.prompt_bound`; every 16th still
  counted exactly, and the engine's reported prompt tokens correct the ratio). Each
  gateway replica learns its own ratio: it is an estimate, nothing is shared or owed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kvpool.adapters.tokenizer import LoadedTokenizer, TokenizerCache, message_texts
from kvpool.api.admission_config import CompiledPool
from kvpool.domain.estimate import PromptSize
from kvpool.domain.prompt_bound import (
    SAMPLE_BYTES,
    SizeByBound,
    TokenRatio,
    bound_tokens,
    decide_prompt_bound,
)
from kvpool.gateway.errors import OVERLOADED, GatewayError
from kvpool.gateway.request import Kind, ParsedRequest, parse_request

log = logging.getLogger("kvpool.gateway")


JSON_BYTES_PER_PROMPT_BYTE = 6  # a control character escaped in six bytes
BODY_SLACK_BYTES = 1024 * 1024  # non-prompt fields: sampling parameters, response_format...


def longest_token_bytes(tokenizer: LoadedTokenizer) -> int:
    """The most UTF-8 bytes one token of the vocabulary stands for (at least 1)."""
    inner = tokenizer.tokenizer
    longest = 1
    for token_id in inner.get_vocab(with_added_tokens=True).values():
        longest = max(longest, len(inner.decode([token_id], skip_special_tokens=False).encode()))
    return longest


class BodyWorker:
    """Runs the heavy steps of a request's admission on worker threads."""

    def __init__(
        self,
        tokenizers: TokenizerCache,
        *,
        parse_workers: int = 1,
        tokenize_workers: int = 2,
        parse_seconds: float = 10.0,
        tokenize_seconds: float = 5.0,
        inline_bytes: int = 8 * 1024,
        load_wait_seconds: float = 2.0,
    ) -> None:
        self.tokenizers = tokenizers
        self.load_wait_seconds = load_wait_seconds  # a request waits this long for a load
        self.inline_bytes = inline_bytes
        self.parse_seconds = parse_seconds
        self.tokenize_seconds = tokenize_seconds
        self._parse = ThreadPoolExecutor(parse_workers, thread_name_prefix="kvpool-parse")
        self._tokenize = ThreadPoolExecutor(tokenize_workers, thread_name_prefix="kvpool-tok")
        self._longest: dict[str, int] = {}  # tokenizer path -> longest token (bytes)
        self._limits: dict[tuple[tuple[str | None, int], ...], int] = {}
        self._ratios: dict[str, TokenRatio] = {}  # pool -> what its exact counts taught

    def close(self) -> None:
        """Stop the workers (running ones finish in the background)."""
        self._parse.shutdown(wait=False, cancel_futures=True)
        self._tokenize.shutdown(wait=False, cancel_futures=True)

    async def body_limit(self, pools: Sequence[CompiledPool], cap: int) -> int:
        """The largest body worth reading: beyond ``max_model_len * B * 6`` bytes (+1 MiB
        for the other fields) no pool of the config can take the prompt it carries, so
        the body is refused (413) before it is read or parsed. Pools without a tokenizer
        give no bound (``cap``, the configured maximum)."""
        key = tuple((p.tokenizer_path, p.max_model_len) for p in pools)
        limit = self._limits.get(key)
        if limit is None:
            loop = asyncio.get_running_loop()
            await asyncio.gather(  # loads under way: wait for them a bounded time
                *(self.tokenizers.loaded(path, self.load_wait_seconds) for path, _ in key)
            )
            limit = await loop.run_in_executor(self._tokenize, self._body_limit, key, cap)
            if not any(self.tokenizers.pending(path) for path, _ in key):
                self._limits = {key: limit}  # one config at a time, once its loads ended
        return min(limit, cap)

    def _body_limit(self, pools: tuple[tuple[str | None, int], ...], cap: int) -> int:
        bound = 0
        for path, max_model_len in pools:
            tokenizer = self.tokenizers.peek(path)  # still loading: no bound yet
            if tokenizer is None:
                return cap
            longest = self._longest.get(tokenizer.path)
            if longest is None:
                longest = self._longest[tokenizer.path] = longest_token_bytes(tokenizer)
            prompt_bytes = max_model_len * longest
            bound = max(bound, prompt_bytes * JSON_BYTES_PER_PROMPT_BYTE + BODY_SLACK_BYTES)
        return bound or cap

    async def parse(self, kind: Kind, raw: bytes) -> ParsedRequest:
        """:func:`parse_request` (on a worker unless the body is small); its 400s come
        through unchanged."""
        if len(raw) <= self.inline_bytes:
            return parse_request(kind, raw)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.parse_seconds):
                return await loop.run_in_executor(self._parse, parse_request, kind, raw)
        except TimeoutError as exc:
            raise GatewayError(
                503,
                "body_timeout",
                f"the body could not be parsed within {self.parse_seconds:g} s; try again",
                OVERLOADED,
                1.0,
            ) from exc

    async def size_prompt(
        self, pool: CompiledPool, parsed: ParsedRequest, prompt: Any, utf8_bytes: int
    ) -> PromptSize:
        """The size of the chat (``prompt`` None) or of one completions prompt: a long
        prompt by the learned bound once the pool's ratio is known, else its exact count
        (:meth:`count_prompt`), which teaches the ratio."""
        messages = len(parsed.messages) if parsed.messages is not None else 0
        ratio = self._ratios.setdefault(pool.name, TokenRatio())
        tokenizer = self.tokenizers.peek(pool.tokenizer_path)
        longest = self._longest.get(tokenizer.path) if tokenizer is not None else None
        if (
            tokenizer is not None
            and longest is not None
            and (parsed.messages is not None or isinstance(prompt, str))
            and utf8_bytes <= pool.max_model_len * longest
        ):
            decision = decide_prompt_bound(ratio, utf8_bytes)
            if isinstance(decision, SizeByBound):
                sample = prompt_sample(parsed.messages, prompt, SAMPLE_BYTES // 2)
                try:
                    sample_tokens = tokenizer.count_text(sample, special=False)
                except Exception as exc:  # content the tokenizer cannot encode
                    log.debug("tokenizer failed on a prompt sample: %s", exc)
                else:
                    tokens = bound_tokens(
                        decision.learned,
                        sample_tokens,
                        len(sample.encode()),
                        utf8_bytes,
                        messages,
                    )
                    return PromptSize(tokens, utf8_bytes, messages, bound=True)
        count = await self.count_prompt(pool, parsed, prompt, utf8_bytes)
        if count is not None:
            ratio.observe(count, utf8_bytes)
        return PromptSize(count, utf8_bytes, messages)

    def engine_counted(self, pool: str, prompt_tokens: int, utf8_bytes: int) -> None:
        """The engine reported ``prompt_tokens`` for a prompt sized by the bound: an exact
        count too, so a bound found short raises the ratio for the next long prompt."""
        ratio = self._ratios.get(pool)
        if ratio is not None:
            ratio.observe(prompt_tokens, utf8_bytes)

    async def count_prompt(
        self, pool: CompiledPool, parsed: ParsedRequest, prompt: Any, utf8_bytes: int
    ) -> int | None:
        """Tokens of the chat (``prompt`` None) or of one completions prompt by the pool's
        tokenizer, or None (no tokenizer, content it cannot count, a prompt certainly too
        long for the model, or the time bound passed)."""
        if parsed.messages is None and isinstance(prompt, list):
            return len(prompt)  # token ids: exact without a tokenizer
        tokenizer = await self.tokenizers.loaded(pool.tokenizer_path, self.load_wait_seconds)
        if tokenizer is None:  # none, or not loaded (yet): the byte estimate
            return None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.tokenize_seconds):
                longest = self._longest.get(tokenizer.path)
                if longest is None:
                    longest = await loop.run_in_executor(
                        self._tokenize, longest_token_bytes, tokenizer
                    )
                    self._longest[tokenizer.path] = longest
                if utf8_bytes > pool.max_model_len * longest:
                    return None  # cannot fit the model: not worth templating/tokenizing
                if utf8_bytes <= self.inline_bytes:
                    return _count(tokenizer, parsed.messages, prompt)
                return await loop.run_in_executor(
                    self._tokenize, _count, tokenizer, parsed.messages, prompt
                )
        except TimeoutError:
            log.warning(
                "prompt count of %d bytes exceeded %.1fs; using the byte estimate",
                utf8_bytes,
                self.tokenize_seconds,
            )
            return None


def prompt_sample(messages: list[dict[str, Any]] | None, prompt: Any, chars: int) -> str:
    """The first and the last ``chars`` characters of a prompt's text (the contents of a
    chat's messages in order), without joining the whole text."""
    texts = _texts(messages, prompt)
    return _head(texts, chars) + "\n" + _tail(texts, chars)


def _texts(messages: list[dict[str, Any]] | None, prompt: Any) -> list[str]:
    if messages is None:
        if isinstance(prompt, str):
            return [prompt]
        return [p for p in prompt if isinstance(p, str)] if isinstance(prompt, list) else []
    return [text for message in messages for text in message_texts(message)]


def _head(texts: list[str], chars: int) -> str:
    taken: list[str] = []
    for text in texts:
        if chars <= 0:
            break
        taken.append(text[:chars])
        chars -= len(taken[-1])
    return "".join(taken)


def _tail(texts: list[str], chars: int) -> str:
    taken: list[str] = []
    for text in reversed(texts):
        if chars <= 0:
            break
        taken.append(text[-chars:])
        chars -= len(taken[-1])
    return "".join(reversed(taken))


def _count(
    tokenizer: LoadedTokenizer, messages: list[dict[str, Any]] | None, prompt: Any
) -> int | None:
    try:
        if messages is not None:
            return tokenizer.count_chat(messages)
        return tokenizer.count_prompt(prompt)
    except Exception as exc:  # content the tokenizer cannot encode
        log.debug("tokenizer failed on a request: %s", exc)
        return None
