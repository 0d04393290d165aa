"""What one request used, as the engine reported it or as the relay observed it.

Why this module exists: the budget is settled and the reservation learned from the tokens
a request *really* used, which only the engine knows. The upstream
(:mod:`kvpool.gateway.upstream`) is the only writer of a request's :class:`UsageMeter`
while it relays the answer; everything after it (settlement, metrics, learning, the access
log) reads the frozen :class:`Usage` it hands back.

One clock: every duration of a request - its queue time, its time to first token, its
whole duration - is measured on the event loop's clock (:func:`request_clock`, monotonic),
from the arrival the pipeline notes to the first token the upstream notes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from kvpool.domain.budget import RequestEnd


def request_clock() -> float:
    """The clock of every request duration: the running event loop's (monotonic)."""
    return asyncio.get_running_loop().time()


@dataclass(frozen=True)
class Usage:
    """What one request used (or what was observed of it when the engine said nothing)."""

    prompt_tokens: int | None = None  # as the engine reported
    completion_tokens: int | None = None  # as the engine reported
    chunks: int = 0  # content chunks relayed (stream)
    reported: bool = False  # the engine's usage was seen
    client_gone: bool = False  # the client disconnected before the answer ended
    sent: bool = False  # the request was handed to the engine (not refused at connect)
    sent_at: float | None = None  # request_clock() when the request went to the engine
    first_token_at: float | None = None  # request_clock() at the first content chunk

    def reported_total(self) -> int | None:
        """Prompt + completion as the engine reported them, or None."""
        if self.reported and self.prompt_tokens is not None and self.completion_tokens is not None:
            return self.prompt_tokens + self.completion_tokens
        return None

    def total(self, prompt_estimate: int) -> int:
        """Tokens used: as reported, else the prompt estimate plus the chunks relayed."""
        reported = self.reported_total()
        if reported is not None:
            return reported
        return prompt_estimate + self.chunks if self.chunks else 0

    def settlement(self, reserved: int, prompt_estimate: int) -> RequestEnd:
        """The facts :func:`kvpool.domain.budget.decide_settlement` needs."""
        return RequestEnd(
            reserved=reserved,
            reported=self.reported_total(),
            observed=self.total(prompt_estimate),
            sent=self.sent,
            client_aborted=self.client_gone,
        )


@dataclass
class UsageMeter:
    """The running count of one request's usage; written by the upstream alone."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    reported: bool = False
    client_gone: bool = False
    client_stalled: bool = False  # cut for not reading (client_gone is set too)
    sent: bool = False
    sent_at: float | None = None
    first_token_at: float | None = None

    def send(self) -> None:
        """The request goes to the engine now."""
        self.sent, self.sent_at = True, request_clock()

    def chunk(self) -> bool:
        """One content chunk relayed; True for the first one (its time is the TTFT)."""
        self.chunks += 1
        if self.first_token_at is None:
            self.first_token_at = request_clock()
            return True
        return False

    def take(self, usage: Any) -> None:
        """Record a ``usage`` object from the engine."""
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                self.prompt_tokens, self.completion_tokens = prompt, completion
                self.reported = True

    def usage(self) -> Usage:
        """What was counted so far, frozen."""
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            chunks=self.chunks,
            reported=self.reported,
            client_gone=self.client_gone,
            sent=self.sent,
            sent_at=self.sent_at,
            first_token_at=self.first_token_at,
        )
