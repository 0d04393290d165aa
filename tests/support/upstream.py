"""A fake :class:`~kvpool.gateway.upstream.Upstream`: the engine faked above the socket.

Why it exists: many request-path tests check what the gateway does with an engine's
*result* - a refused connection ejects the replica, a client that left keeps its charge,
the engine's usage settles the budget - where a real port adds nothing but time. The fake
answers each call from a script of :class:`FakeAnswer`\\ s (a default one when the script
is empty), records every :class:`~kvpool.gateway.upstream.UpstreamCall`, and writes the
call's meter as the real upstream does (it is the upstream). Tests of the relay itself
(streams, headers, timeouts over a socket) keep the fake engine *server*
(:class:`tests.support.gateway.FakeEngine`) or a real vLLM engine.

    upstream = FakeUpstream([FakeAnswer.refused()])
    client, gateway = await gateway_client(config, upstream=upstream)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web

from kvpool.domain.outlier import FailureKind
from kvpool.gateway.errors import UPSTREAM, GatewayError
from kvpool.gateway.upstream import UpstreamCall, UpstreamResult


@dataclass(frozen=True)
class FakeAnswer:
    """How the fake engine answers one call."""

    status: int = 200  # what the client gets
    label: str = "ok"
    prompt_tokens: int = 5  # reported usage (None-like when ``reported`` is False)
    completion_tokens: int = 4
    reported: bool = True  # the engine's usage reached the gateway
    sent: bool = True  # the engine got the request
    fault: FailureKind | None = None  # reported to outlier ejection
    error_kind: str | None = None  # upstream_errors_total's kind
    chunks: int = 0  # content chunks relayed (a stream): the first one is the first token

    @classmethod
    def refused(cls) -> FakeAnswer:
        """The replica refused the connection (nothing listens)."""
        return cls(
            503,
            "engine_unavailable",
            reported=False,
            sent=False,
            fault="refused",
            error_kind="connect",
        )

    @classmethod
    def timed_out(cls) -> FakeAnswer:
        """No answer within the deadline."""
        return cls(504, "engine_timeout", reported=False, fault="timeout", error_kind="timeout")


@dataclass
class FakeUpstream:
    """Answers calls from ``answers`` (then with ``FakeAnswer()``), recording them."""

    answers: list[FakeAnswer] = field(default_factory=list)
    calls: list[UpstreamCall] = field(default_factory=list)
    hold: asyncio.Event | None = None  # when set: no answer before the event is set

    async def send(self, call: UpstreamCall) -> UpstreamResult:
        self.calls.append(call)
        answer = self.answers.pop(0) if self.answers else FakeAnswer()
        meter = call.meter
        meter.sent = answer.sent
        try:
            if self.hold is not None:
                await self.hold.wait()
            if call.gate is not None and answer.status < 500:  # as the real one: before any
                # byte of an answer goes to the client (an engine that failed sent none)
                await call.gate()
        except GatewayError as refused:
            return UpstreamResult(
                refused.status, refused.code, meter.usage(), None, refused.response()
            )
        except asyncio.CancelledError:
            meter.client_gone = True
            raise
        for _ in range(answer.chunks):
            if meter.chunk() and call.on_first_token is not None:
                call.on_first_token()
        if answer.reported:
            meter.take(
                {
                    "prompt_tokens": answer.prompt_tokens,
                    "completion_tokens": answer.completion_tokens,
                }
            )
        if answer.status >= 500:
            response = GatewayError(answer.status, answer.label, "fake engine", UPSTREAM).response()
        else:
            body = {
                "id": "fake",
                "choices": [],
                "usage": {
                    "prompt_tokens": answer.prompt_tokens,
                    "completion_tokens": answer.completion_tokens,
                },
            }
            response = web.Response(
                status=answer.status,
                body=json.dumps(body).encode(),
                content_type="application/json",
            )
        return UpstreamResult(
            answer.status, answer.label, meter.usage(), answer.fault, response, answer.error_kind
        )

    def bodies(self) -> list[dict[str, object]]:
        """The JSON bodies the gateway sent, in order."""
        return [json.loads(call.body) for call in self.calls]
