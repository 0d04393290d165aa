"""From which relayed chunk a stream hands its place on (kvpool.domain.handover)."""

from __future__ import annotations

import pytest

from kvpool.domain.handover import NON_TOKEN_CHUNKS, handover_chunk


@pytest.mark.parametrize(
    ("bound", "tokens", "chunk"),
    [
        pytest.param(100, 8, 100 - 8 + NON_TOKEN_CHUNKS, id="eight-tokens-before-a-100-bound"),
        pytest.param(16, 8, 16 - 8 + NON_TOKEN_CHUNKS, id="a-short-chat"),
        pytest.param(9, 8, 9 - 8 + NON_TOKEN_CHUNKS, id="just-above-the-handover"),
        pytest.param(8, 8, None, id="bound-not-above-the-handover-never"),
        pytest.param(100, 0, None, id="off"),
        pytest.param(None, 8, None, id="no-bound-never"),
    ],
)
def test_handover_chunk(bound: int | None, tokens: int, chunk: int | None) -> None:
    assert handover_chunk(bound, tokens) == chunk


@pytest.mark.parametrize("non_token", range(NON_TOKEN_CHUNKS + 1))
@pytest.mark.parametrize("bound", [9, 16, 100, 1024])
def test_at_the_handover_chunk_at_most_the_handover_tokens_are_left(
    bound: int, non_token: int
) -> None:
    """Whatever number of the stream's chunks carried no token (up to the allowance), a
    stream at its handover chunk has generated at least ``bound - tokens``."""
    tokens = 8
    chunk = handover_chunk(bound, tokens)
    assert chunk is not None
    generated = chunk - non_token
    assert bound - generated <= tokens
