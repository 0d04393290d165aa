"""Which bodies the gateway handles on its event loop and which on worker threads.

Small bodies (at most ``inline_bytes``) are parsed and counted inline: a hand-off to a
worker waits for the GIL the loop holds, which cost interactive requests milliseconds
while the loop relayed streams. Larger ones still go to the workers (the 7.5 MiB case is
in tests/integration/test_gateway_body.py). Real tokenizer (the tiny model's).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.gateway.body import BodyWorker
from tests.builders import AdmissionConfigBuilder


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
    pool = (
        AdmissionConfigBuilder()
        .tier("interactive", 50)
        .pool(
            "tiny", ["http://127.0.0.1:9"], tokenizer_path=tiny_tokenizer_json, max_model_len=8192
        )
        .obj()
        .pools[0]
    )
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
