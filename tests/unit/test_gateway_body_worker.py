"""Which bodies the gateway handles on its event loop and which on worker threads.

Small bodies (at most ``inline_bytes``) are parsed and counted inline: a hand-off to a
worker waits for the GIL the loop holds, which cost interactive requests milliseconds
while the loop relayed streams. Larger ones still go to the workers (the 7.5 MiB case is
in tests/integration/test_gateway_body.py). Real tokenizer (the tiny model's).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import CompiledPool
from kvpool.domain.estimate import PromptSize
from kvpool.gateway.body import BodyWorker
from kvpool.gateway.request import ParsedRequest
from tests.builders import AdmissionConfigBuilder


def _tiny_pool(tokenizer: Path, max_model_len: int) -> CompiledPool:
    """One pool of the tiny model with its real tokenizer."""
    return (
        AdmissionConfigBuilder()
        .tier("interactive", 50)
        .pool("tiny", ["http://127.0.0.1:9"], tokenizer_path=tokenizer, max_model_len=max_model_len)
        .obj()
        .pools[0]
    )


def _chat(words: int) -> bytes:
    content = " ".join(["token"] * words)
    return json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    ).encode()


@pytest.mark.parametrize(
    ("words", "inline"),
    [(10, True), (1200, True), (2000, False)],
    ids=["short-chat-inline", "just-under-8-KiB-inline", "over-8-KiB-on-a-worker"],
)
async def test_small_bodies_are_handled_on_the_loop(
    tiny_tokenizer_json: Path, words: int, inline: bool
) -> None:
    worker = BodyWorker(TokenizerCache())
    pool = _tiny_pool(tiny_tokenizer_json, max_model_len=8192)
    raw = _chat(words)
    assert (len(raw) <= worker.inline_bytes) is inline
    await worker.body_limit([pool], 8 << 20)  # loads the tokenizer's longest token once
    worker.close()  # from here on a hand-off to a worker fails
    if inline:
        parsed = await worker.parse("chat", raw)
        count = await worker.count_prompt(pool, parsed, None, parsed.prompt_utf8_bytes)
        assert count is not None and count >= words
    else:
        with pytest.raises(RuntimeError, match="shutdown"):
            await worker.parse("chat", raw)


async def test_counting_a_long_prompt_on_a_worker_leaves_the_loop_running(
    tiny_tokenizer_json: Path,
) -> None:
    # Tokenizer.encode held the GIL for the whole encoding: while a worker counted a
    # 100k-token prompt (~130 ms) the loop, waiting for the GIL, ran 0-3 turns. The batch
    # call releases it, so the loop keeps relaying streams meanwhile.
    worker = BodyWorker(TokenizerCache())
    pool = _tiny_pool(tiny_tokenizer_json, max_model_len=200_000)
    await worker.body_limit([pool], 64 << 20)  # loads the tokenizer and its longest token
    words = [f"w{i % 997}x{i % 13}" for i in range(60_000)]
    raw = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": " ".join(words)}]}
    ).encode()
    parsed = await worker.parse("chat", raw)
    counting = asyncio.ensure_future(
        worker.count_prompt(pool, parsed, None, parsed.prompt_utf8_bytes)
    )
    turns = 0
    while not counting.done():
        await asyncio.sleep(0.001)  # one loop turn (of a millisecond) while the worker counts
        turns += 1
    count = counting.result()
    worker.close()
    assert count is not None and count > 60_000
    assert turns >= 20, f"the loop ran {turns} turns while {count} tokens were counted"


async def test_long_prompts_are_sized_by_a_bound_at_least_their_count(
    tiny_tokenizer_json: Path,
) -> None:
    # Eight exact counts of long prompts teach the pool's ratio; the next long prompts are
    # sized by the bound from a sample of each: never below the tokenizer's count (here
    # within 25 % of it), and a prompt unlike the traffic (CJK, 1.0 token a byte, after
    # English words, 0.4) is caught by its own sample. Real tokenizer (the tiny model's).
    worker = BodyWorker(TokenizerCache())
    pool = _tiny_pool(tiny_tokenizer_json, max_model_len=1 << 20)
    await worker.body_limit([pool], 64 << 20)  # loads the tokenizer and its longest token
    tokenizer = worker.tokenizers.peek(str(tiny_tokenizer_json))
    assert tokenizer is not None

    def chat(content: str) -> bytes:
        return json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": content}]}
        ).encode()

    async def size(content: str) -> tuple[PromptSize, ParsedRequest]:
        parsed = await worker.parse("chat", chat(content))
        return await worker.size_prompt(pool, parsed, None, parsed.prompt_utf8_bytes), parsed

    vocabulary = ["the", "model", "serves", "tokens", "quickly", "and", "a", "request", "waits"]
    rng = random.Random(7)
    words = [rng.choice(vocabulary) for _ in range(40_000)]
    for start in range(8):
        learning, _ = await size(" ".join(words[start * 1000 : start * 1000 + 6000]))
        assert not learning.bound and learning.tokens is not None
    prose, parsed = await size(" ".join(words[9000:29_000]))
    exact = tokenizer.count_chat(parsed.messages or [])
    assert prose.bound and exact is not None
    assert exact <= prose.tokens <= 1.25 * exact, (prose.tokens, exact)
    cjk = "".join(chr(0x4E00 + i * 7 % 2000) for i in range(20_000))
    unlike, parsed = await size(cjk)
    exact = tokenizer.count_chat(parsed.messages or [])
    assert unlike.bound and exact is not None and unlike.tokens >= exact, (unlike.tokens, exact)
    assert exact > 2 * prose.tokens / prose.utf8_bytes * unlike.utf8_bytes  # learned: far short
    # the engine reports more than the learned ratio assumed: the next bound follows it
    before, _ = await size(" ".join(words[:20_000]))
    worker.engine_counted("tiny", 3 * (before.tokens or 0), before.utf8_bytes)
    after, _ = await size(" ".join(words[:20_000]))
    worker.close()
    assert after.bound and (after.tokens or 0) >= 3 * (before.tokens or 0)
