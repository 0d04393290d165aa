"""Send an admitted request to its engine and relay the answer, measuring the real usage.

Why this module exists: the budget is settled and the estimate error measured with the
tokens a request *really* used, which only the engine knows. Non-streaming responses carry
``usage``; for streams the gateway always asks the engine for
``stream_options: {include_usage: true}`` and removes that final usage chunk again when the
caller did not ask for it. If a stream breaks off (client gone, engine died), the usage is
the prompt plus one token per content chunk relayed so far - a lower bound: the budget
settlement (``decide_settlement``) then keeps the reservation charged instead.

Bodies are passed through as bytes (the engine's JSON is not re-encoded). Only a short
allowlist of headers goes upstream (content type, accept, user agent): nothing the caller
sends - ``priority``, ``x-priority`` or any other header - can influence the engine's
scheduling; the gateway sets the body's ``priority`` from the tier.

Engine failures become gateway errors a client can act on:

===========================================  ===================================
engine refuses the connection                503 ``engine_unavailable`` (+ Retry-After)
no first token / answer in time (see below)  504 ``engine_timeout``
engine answers 5xx / drops the connection    502 ``engine_error``
engine answers 4xx (it rejects the request)  passed through (its JSON says why)
stream breaks after it started               an SSE ``error`` event, then the end
===========================================  ===================================

Timeouts (:class:`UpstreamLimits`): a stream gets a first-token timeout and then an idle
timeout between chunks, a non-streaming answer a total timeout; outlier ejection
(:mod:`kvpool.gateway.ejection`) expires them early when the replica is found hung.

Client disconnect: the request handler is cancelled (aiohttp ``handler_cancellation``) or
a write fails; leaving the ``async with`` closes the upstream connection, which makes vLLM
abort the request and free its KV cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from kvpool.domain.budget import RequestEnd
from kvpool.gateway.errors import UPSTREAM, GatewayError

FORWARDED_HEADERS = ("Accept", "User-Agent")
SSE_DATA = b"data: "
SSE_DONE = b"[DONE]"
SSE_END = b"\n\n"  # vLLM ends every event with a blank line


@dataclass(frozen=True)
class UpstreamLimits:
    """Timeouts of one upstream request (seconds).

    A stream must show its first token within ``first_token`` and then never stall longer
    than ``idle`` between chunks; a non-streaming answer (the engine sends nothing until it
    is done) gets ``total``. A hung engine is caught sooner by outlier ejection, which
    expires the deadline of every request in flight on it."""

    connect: float = 2.0
    first_token: float = 20.0
    idle: float = 30.0
    total: float = 600.0


@dataclass
class UsageMeter:
    """What the engine reported (or what was observed) for one request."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0  # content chunks relayed (stream)
    reported: bool = False  # True when the engine's usage was seen
    client_gone: bool = False  # the client disconnected during the stream
    sent: bool = False  # the request was handed to the engine (not refused at connect)
    stream_response: web.StreamResponse | None = None  # set once a stream has started
    first_token_at: float | None = None  # monotonic time of the first content chunk (TTFT)
    on_first_token: Callable[[], None] | None = None  # called once, at the first chunk

    def settlement(self, reserved: int, prompt_estimate: int) -> RequestEnd:
        """The facts :func:`kvpool.domain.budget.decide_settlement` needs."""
        reported = None
        if self.reported and self.prompt_tokens is not None and self.completion_tokens is not None:
            reported = self.prompt_tokens + self.completion_tokens
        return RequestEnd(
            reserved=reserved,
            reported=reported,
            observed=self.total(prompt_estimate),
            sent=self.sent,
            client_aborted=self.client_gone,
        )

    def chunk(self) -> None:
        """One content chunk relayed; the first one marks the time to first token."""
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
            if self.on_first_token is not None:
                self.on_first_token()
        self.chunks += 1

    def take(self, usage: Any) -> None:
        """Record a ``usage`` object from the engine."""
        if isinstance(usage, dict):
            prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(prompt, int) and isinstance(completion, int):
                self.prompt_tokens, self.completion_tokens = prompt, completion
                self.reported = True

    def total(self, prompt_estimate: int) -> int:
        """Tokens used: as reported, else the prompt estimate plus the chunks relayed."""
        if self.reported and self.prompt_tokens is not None and self.completion_tokens is not None:
            return self.prompt_tokens + self.completion_tokens
        return prompt_estimate + self.chunks if self.chunks else 0


class UpstreamError(GatewayError):
    """An engine failure, with the kind for metrics and whether the replica is down."""

    def __init__(self, status: int, code: str, message: str, kind: str, replica_down: bool):
        super().__init__(
            status, code, message, type=UPSTREAM, retry_after=1.0 if status == 503 else None
        )
        self.kind = kind
        self.replica_down = replica_down


def build_upstream_body(body: dict[str, Any], engine_priority: int | None, stream: bool) -> bytes:
    """The body sent to the engine: the caller's, with our priority and usage request."""
    out = dict(body)
    if engine_priority is not None:
        out["priority"] = engine_priority
    if stream:
        options = dict(out.get("stream_options") or {})
        options["include_usage"] = True
        out["stream_options"] = options
    return json.dumps(out, separators=(",", ":")).encode()


def _forward_headers(request: web.Request) -> dict[str, str]:
    # The body sent upstream is the JSON the gateway parsed and rebuilt, whatever the caller
    # declared (``curl -d`` says form-encoded), so its type is always application/json.
    headers = {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
    headers["Content-Type"] = "application/json"
    return headers


def _engine_message(raw: bytes) -> str:
    try:
        doc = json.loads(raw)
        error = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return str(doc["message"])[:300]
    except (ValueError, RecursionError):
        pass
    return raw[:300].decode("utf-8", "replace")


async def proxy_request(
    session: aiohttp.ClientSession,
    request: web.Request,
    url: str,
    body: bytes,
    *,
    stream: bool,
    caller_wants_usage: bool,
    meter: UsageMeter,
    limits: UpstreamLimits | None = None,
    track: Callable[[asyncio.Timeout], AbstractContextManager[None]] | None = None,
) -> web.StreamResponse:
    """POST ``body`` to ``url`` and relay the answer to ``request``'s client.

    The request runs under a deadline (``limits.first_token`` for a stream, lifted at its
    first token; ``limits.total`` otherwise); ``track`` registers that deadline so outlier
    ejection can expire it early. An expired deadline is a 504 ``engine_timeout`` (or, once
    a stream has started, an in-band error event: :class:`StreamBrokenError`)."""
    limits = limits or UpstreamLimits()
    loop = asyncio.get_running_loop()
    first = limits.first_token if stream else limits.total
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=limits.connect, sock_read=limits.idle if stream else None
    )
    try:
        async with asyncio.timeout(loop.time() + first) as deadline:
            with track(deadline) if track is not None else contextlib.nullcontext():
                return await _proxy(
                    session,
                    request,
                    url,
                    body,
                    stream=stream,
                    caller_wants_usage=caller_wants_usage,
                    meter=meter,
                    timeout=timeout,
                    deadline=deadline if stream else None,
                )
    except TimeoutError as exc:
        if meter.stream_response is not None:
            error = _stream_error("the engine stopped sending tokens in time")
            raise StreamBrokenError(meter.stream_response, error, kind="timeout") from exc
        raise UpstreamError(
            504, "engine_timeout", "the engine did not answer in time", "timeout", False
        ) from exc


async def _proxy(
    session: aiohttp.ClientSession,
    request: web.Request,
    url: str,
    body: bytes,
    *,
    stream: bool,
    caller_wants_usage: bool,
    meter: UsageMeter,
    timeout: aiohttp.ClientTimeout,
    deadline: asyncio.Timeout | None,
) -> web.StreamResponse:
    meter.sent = True
    headers = _forward_headers(request)
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as upstream:
            if upstream.status >= 500:
                raw = await upstream.read()
                raise UpstreamError(
                    502,
                    "engine_error",
                    f"the engine failed (HTTP {upstream.status}): {_engine_message(raw)}",
                    "status_5xx",
                    replica_down=False,
                )
            content_type = upstream.headers.get("Content-Type", "")
            if not stream or upstream.status != 200 or "text/event-stream" not in content_type:
                raw = await upstream.read()
                if upstream.status == 200:
                    _meter_json(raw, meter)
                return web.Response(
                    status=upstream.status,
                    body=raw,
                    content_type=content_type.split(";")[0] or "application/json",
                )
            return await _relay_stream(request, upstream, caller_wants_usage, meter, deadline)
    except aiohttp.ClientConnectorError as exc:
        meter.sent = False  # refused: the engine never saw the request
        raise UpstreamError(
            503,
            "engine_unavailable",
            f"the engine could not be reached ({exc.os_error or exc}); try again",
            "connect",
            replica_down=True,
        ) from exc
    except TimeoutError as exc:
        raise UpstreamError(
            504, "engine_timeout", "the engine did not answer in time", "timeout", False
        ) from exc
    except aiohttp.ClientError as exc:
        raise UpstreamError(
            502,
            "engine_error",
            f"the engine connection failed: {type(exc).__name__}",
            "broken",
            False,
        ) from exc


def _meter_json(raw: bytes, meter: UsageMeter) -> None:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return
    if isinstance(doc, dict):
        meter.take(doc.get("usage"))


def _is_usage_only(payload: bytes, meter: UsageMeter) -> bool:
    """Meter one SSE data payload; True if it is the final usage-only chunk."""
    if payload == SSE_DONE:
        return False
    if b'"usage"' not in payload:
        meter.chunk()
        return False
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    usage = doc.get("usage")
    if usage is not None:
        meter.take(usage)
    choices = doc.get("choices")
    if choices:
        meter.chunk()
        return False
    return usage is not None


async def _write(response: web.StreamResponse, data: bytes, meter: UsageMeter) -> bool:
    """Write to the client; False (and ``meter.client_gone``) if it went away."""
    try:
        await response.write(data)
    except ConnectionError:  # leaving the relay closes the upstream request too
        meter.client_gone = True
        return False
    return True


async def _relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    caller_wants_usage: bool,
    meter: UsageMeter,
    deadline: asyncio.Timeout | None,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    await response.prepare(request)
    meter.stream_response = response
    pending = b""
    try:
        async for data in upstream.content.iter_any():
            if deadline is not None and meter.chunks == 0 and SSE_DATA in data:
                deadline.reschedule(None)  # first token seen: only the idle timeout is left
            pending += data
            if SSE_END not in pending:
                continue
            *events, pending = pending.split(SSE_END)
            out = []
            for event in events:
                if event.startswith(SSE_DATA):
                    usage_only = _is_usage_only(event[len(SSE_DATA) :].strip(), meter)
                    if usage_only and not caller_wants_usage:
                        continue
                out.append(event + SSE_END)
            if out and not await _write(response, b"".join(out), meter):
                return response
        if pending.strip() and not await _write(response, pending, meter):
            return response
    except (
        aiohttp.ClientPayloadError,
        aiohttp.ServerDisconnectedError,
        TimeoutError,
        ValueError,
    ) as exc:
        # the engine broke off mid-stream: tell the client in-band, the status is already sent
        error = _stream_error(f"the engine stream broke off: {type(exc).__name__}")
        kind = "timeout" if isinstance(exc, TimeoutError) else "broken"
        raise StreamBrokenError(response, error, kind) from exc
    await response.write_eof()
    return response


def _stream_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": UPSTREAM, "code": "engine_stream_broken"}}


class StreamBrokenError(Exception):
    """A stream that started and then failed upstream; the handler reports and ends it."""

    def __init__(
        self, response: web.StreamResponse, error: dict[str, Any], kind: str = "broken"
    ) -> None:
        super().__init__(error["error"]["message"])
        self.response = response
        self.error = error
        self.kind = kind  # "timeout" (stalled: the replica is an outlier) or "broken"

    async def finish(self) -> web.StreamResponse:
        """Write the error event and end the stream (ignoring a client already gone)."""
        try:
            await self.response.write(b"data: " + json.dumps(self.error).encode() + b"\n\n")
            await self.response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return self.response


async def wait_closed(session: aiohttp.ClientSession) -> None:
    """Close a client session and give its connections a moment to close."""
    await session.close()
    await asyncio.sleep(0)
