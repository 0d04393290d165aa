"""Send an admitted request to its engine, relay the answer, and say how it went.

Why this module exists: the handler should not know how an engine fails. :class:`Upstream`
is the seam (httpx's transport interface is the model): ``send(call)`` relays one request
and returns an :class:`UpstreamResult` - the status the client got, a label for metrics
and the access log, the usage the engine reported (or that was observed), and whether the
replica is at fault (for outlier ejection). :class:`AiohttpUpstream` is the real one, over
one pooled ``aiohttp.ClientSession``; tests of the request path that need no socket pass
a fake (tests/support/upstream.py).

The real relay measures the real usage: non-streaming responses carry ``usage``; for
streams the request body asks the engine for ``stream_options: {include_usage: true}``
(:func:`kvpool.gateway.request.build_upstream_body`) and the final usage chunk is removed
again when the caller did not ask for it. If a stream breaks off (client gone, engine
died), the usage is the prompt plus one token per content chunk relayed so far - a lower
bound: the budget settlement (``decide_settlement``) then keeps the reservation charged.

Bodies are passed through as bytes (the engine's JSON is not re-encoded). Only a short
allowlist of headers goes upstream (accept, user agent; the content type is always JSON):
nothing the caller sends - ``priority``, ``x-priority`` or any other header - can
influence the engine's scheduling.

Engine failures become answers a client can act on, classified here:

===========================================  ===================================  =========
engine ...                                   answer (label)                       replica
===========================================  ===================================  =========
refuses the connection                       503 ``engine_unavailable``           refused
sends no first token / answer in time        504 ``engine_timeout``               timeout
answers 5xx / drops the connection           502 ``engine_error``                 -
answers 4xx (it rejects the request)         passed through (``engine_rejected``)  -
stream stalls after it started               SSE ``error`` event, 200             timeout
stream breaks after it started               SSE ``error`` event, 200             -
===========================================  ===================================  =========

(the label of the three error answers is their code; both stream failures are labelled
``engine_stream_broken``; a client that went away is 499 ``client_gone``).

Timeouts (:class:`UpstreamLimits`): a stream gets a first-token timeout and then an idle
timeout between chunks, a non-streaming answer a total timeout; outlier ejection
(:mod:`kvpool.gateway.ejection`) expires them early when the replica is found hung
(``call.track`` registers the deadline).

Client disconnect: the request handler is cancelled (aiohttp ``handler_cancellation``) or
a write fails; leaving the ``async with`` closes the upstream connection, which makes vLLM
abort the request and free its KV cache.

A client that stops reading (issue 18.1): every write to it - the chunks, the end of the
stream, the in-band error event - gets the idle timeout too. A write that cannot go out
within it (the client's receive window and the socket buffers full) cuts the client: its
connection is aborted (the buffered bytes are dropped), the call ends as 499
``client_stalled`` and the upstream request is closed. Before, the relay waited in
``response.write()`` forever and held its reservation and its engine slot. And the
reservation does not wait for the client at all once the engine is done with the request:
``call.on_engine_done`` is called as soon as the engine's stream has ended (its ``[DONE]``
event, its end, or its failure), before the last bytes go to the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from kvpool.domain.outlier import FailureKind
from kvpool.gateway.errors import UPSTREAM, GatewayError
from kvpool.gateway.usage import Usage, UsageMeter

FORWARDED_HEADERS = ("Accept", "User-Agent")
SSE_DATA = b"data: "
SSE_DONE = b"[DONE]"
SSE_END = b"\n\n"  # vLLM ends every event with a blank line
STREAM_BROKEN = "engine_stream_broken"
CLIENT_STALLED = "client_stalled"


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


@dataclass(frozen=True)
class UpstreamCall:
    """One request for an engine, and where its answer goes."""

    url: str  # the replica's URL with the request's path
    body: bytes  # build_upstream_body's
    stream: bool
    caller_wants_usage: bool  # keep the final usage chunk of a stream
    client: web.Request  # the caller: its answer is relayed to it
    on_first_token: Callable[[], None] | None = None  # called once, at the first chunk
    # registers the request's deadline while it is in flight (ejection expires it early)
    track: Callable[[asyncio.Timeout], AbstractContextManager[None]] | None = None
    meter: UsageMeter = field(default_factory=UsageMeter)  # written by the upstream only
    # the engine holds nothing more for this call (its stream ended): release the
    # reservation now, before the last writes to the client; called at most once
    on_engine_done: Callable[[], None] | None = None
    # a stream that has relayed this many chunks has at most a few tokens to go
    # (kvpool.domain.handover): on_handover is then called, once
    handover_at: int | None = None
    on_handover: Callable[[], None] | None = None
    # awaited before any byte of the engine's answer goes to the client (a request sent
    # ahead of its budget verdict); a GatewayError it raises is the answer instead, and
    # the engine's request is closed
    gate: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True)
class UpstreamResult:
    """How a call ended."""

    status: int  # what the client got (499: it went away)
    label: str  # ok, engine_rejected, client_gone, client_stalled, engine_stream_broken, or
    # an error code
    usage: Usage
    replica_fault: FailureKind | None  # refused / timeout: report to outlier ejection
    response: web.StreamResponse  # what the handler returns
    error_kind: str | None = None  # for upstream_errors_total: connect, timeout, status_5xx,
    # broken, stream_broken


class Upstream(Protocol):
    """Relays a request to an engine and its answer to the caller."""

    async def send(self, call: UpstreamCall) -> UpstreamResult:
        """Relay ``call``; a cancelled caller (client gone) propagates CancelledError with
        ``call.meter.client_gone`` set."""
        ...


class _EngineFailedError(Exception):
    """The engine failed before any answer reached the client."""

    def __init__(
        self, status: int, code: str, message: str, kind: str, fault: FailureKind | None
    ) -> None:
        super().__init__(message)
        self.error = GatewayError(status, code, message, type=UPSTREAM)
        self.kind = kind
        self.fault = fault


@dataclass
class _Progress:
    """How far one call got: the stream's response once its head was sent to the client."""

    stream: web.StreamResponse | None = None


class _StreamBrokenError(Exception):
    """A stream that started and then failed upstream."""

    def __init__(self, response: web.StreamResponse, message: str, fault: FailureKind | None):
        super().__init__(message)
        self.response = response
        self.fault = fault


def _timed_out() -> _EngineFailedError:
    return _EngineFailedError(
        504, "engine_timeout", "the engine did not answer in time", "timeout", "timeout"
    )


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


class AiohttpUpstream:
    """The real upstream: one pooled aiohttp session to every engine."""

    def __init__(self, session: aiohttp.ClientSession, limits: UpstreamLimits) -> None:
        self.session = session
        self.limits = limits

    async def send(self, call: UpstreamCall) -> UpstreamResult:
        meter = call.meter
        progress = _Progress()
        try:
            response = await self._deadlined(call, progress)
        except _EngineFailedError as failed:
            return UpstreamResult(
                failed.error.status,
                failed.error.code,
                meter.usage(),
                failed.fault,
                failed.error.response(),
                failed.kind,
            )
        except _StreamBrokenError as broken:
            _engine_done(call)
            await _end_stream_with_error(call, broken.response, str(broken), self.limits.idle)
            if meter.client_stalled:
                return UpstreamResult(499, CLIENT_STALLED, meter.usage(), None, broken.response)
            return UpstreamResult(
                200, STREAM_BROKEN, meter.usage(), broken.fault, broken.response, "stream_broken"
            )
        except GatewayError as refused:  # by the gate: nothing went to the client
            return UpstreamResult(
                refused.status, refused.code, meter.usage(), None, refused.response()
            )
        except asyncio.CancelledError:
            meter.client_gone = True
            raise
        if meter.client_gone:
            label = CLIENT_STALLED if meter.client_stalled else "client_gone"
            return UpstreamResult(499, label, meter.usage(), None, response)
        label = "ok" if response.status < 400 else "engine_rejected"
        return UpstreamResult(response.status, label, meter.usage(), None, response)

    async def _deadlined(self, call: UpstreamCall, progress: _Progress) -> web.StreamResponse:
        """The call under its deadline (``first_token`` for a stream, lifted at its first
        token; ``total`` otherwise), registered with ``call.track``."""
        limits = self.limits
        first = limits.first_token if call.stream else limits.total
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(loop.time() + first) as deadline:
                tracking = call.track(deadline) if call.track else contextlib.nullcontext()
                with tracking:
                    return await self._post(call, deadline, progress)
        except TimeoutError as exc:
            if progress.stream is not None:
                raise _StreamBrokenError(
                    progress.stream, "the engine stopped sending tokens in time", "timeout"
                ) from exc
            raise _timed_out() from exc

    async def _post(
        self, call: UpstreamCall, deadline: asyncio.Timeout, progress: _Progress
    ) -> web.StreamResponse:
        meter = call.meter
        meter.send()
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.limits.connect,
            sock_read=self.limits.idle if call.stream else None,
        )
        headers = _forward_headers(call.client)
        try:
            async with self.session.post(
                call.url, data=call.body, headers=headers, timeout=timeout
            ) as upstream:
                if upstream.status >= 500:
                    raw = await upstream.read()
                    raise _EngineFailedError(
                        502,
                        "engine_error",
                        f"the engine failed (HTTP {upstream.status}): {_engine_message(raw)}",
                        "status_5xx",
                        None,
                    )
                content_type = upstream.headers.get("Content-Type", "")
                streams = upstream.status == 200 and "text/event-stream" in content_type
                if not call.stream or not streams:
                    raw = await upstream.read()
                    if upstream.status == 200:
                        _meter_json(raw, meter)
                    if call.gate is not None:
                        await call.gate()
                    return web.Response(
                        status=upstream.status,
                        body=raw,
                        content_type=content_type.split(";")[0] or "application/json",
                    )
                return await _relay_stream(call, upstream, deadline, progress, self.limits.idle)
        except aiohttp.ClientConnectorError as exc:
            meter.sent = False  # refused: the engine never saw the request
            raise _EngineFailedError(
                503,
                "engine_unavailable",
                f"the engine could not be reached ({exc.os_error or exc}); try again",
                "connect",
                "refused",
            ) from exc
        except TimeoutError as exc:
            raise _timed_out() from exc
        except aiohttp.ClientError as exc:
            raise _EngineFailedError(
                502,
                "engine_error",
                f"the engine connection failed: {type(exc).__name__}",
                "broken",
                None,
            ) from exc


def _meter_json(raw: bytes, meter: UsageMeter) -> None:
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return
    if isinstance(doc, dict):
        meter.take(doc.get("usage"))


def _is_usage_only(payload: bytes, call: UpstreamCall) -> bool:
    """Meter one SSE data payload; True if it is the final usage-only chunk."""
    if payload == SSE_DONE:
        return False
    if b'"usage"' not in payload:
        _content_chunk(call)
        return False
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    usage = doc.get("usage")
    if usage is not None:
        call.meter.take(usage)
    if doc.get("choices"):
        _content_chunk(call)
        return False
    return usage is not None


def _content_chunk(call: UpstreamCall) -> None:
    if call.meter.chunk() and call.on_first_token is not None:
        call.on_first_token()
    if call.meter.chunks == call.handover_at and call.on_handover is not None:
        call.on_handover()


def _engine_done(call: UpstreamCall) -> None:
    """The engine's stream ended: let the caller release the reservation (once)."""
    if call.on_engine_done is not None:
        call.on_engine_done()


def _cut_client(call: UpstreamCall) -> None:
    """Drop a client that stopped reading: abort its connection (the bytes buffered for it
    are dropped at once; aiohttp then cancels the handler as for a client gone)."""
    call.meter.client_gone = True
    call.meter.client_stalled = True
    transport = call.client.transport
    if transport is not None:
        transport.abort()


async def _write(
    call: UpstreamCall, response: web.StreamResponse, data: bytes, idle: float, *, eof: bool = False
) -> bool:
    """Write to the client (``eof``: and end the response) within ``idle`` seconds; False
    (and ``meter.client_gone``) if it went away or did not take the bytes in time."""
    try:
        async with asyncio.timeout(idle):
            if eof:
                await response.write_eof(data)
            else:
                await response.write(data)
    except TimeoutError:  # a stalled reader: cut it, leaving the relay closes the upstream
        _cut_client(call)
        return False
    except ConnectionError:  # leaving the relay closes the upstream request too
        call.meter.client_gone = True
        return False
    return True


async def _relay_stream(
    call: UpstreamCall,
    upstream: aiohttp.ClientResponse,
    deadline: asyncio.Timeout,
    progress: _Progress,
    idle: float,
) -> web.StreamResponse:
    meter = call.meter
    response = web.StreamResponse(
        status=200,
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
    )
    chunks: AsyncIterator[bytes] = upstream.content.iter_any()
    if call.gate is not None:  # the engine works on its first token while the gate is shut
        first = await anext(chunks, b"")
        await call.gate()
        chunks = _after(first, chunks)
    await response.prepare(call.client)
    progress.stream = response
    pending = b""
    try:
        async for data in chunks:
            if meter.chunks == 0 and SSE_DATA in data:
                deadline.reschedule(None)  # first token seen: only the idle timeout is left
            pending += data
            if SSE_END not in pending:
                continue
            *events, pending = pending.split(SSE_END)
            out = []
            for event in events:
                if event.startswith(SSE_DATA):
                    payload = event[len(SSE_DATA) :].strip()
                    if payload == SSE_DONE:  # the engine's last event: it holds nothing more
                        _engine_done(call)
                    usage_only = _is_usage_only(payload, call)
                    if usage_only and not call.caller_wants_usage:
                        continue
                out.append(event + SSE_END)
            if out and not await _write(call, response, b"".join(out), idle):
                return response
        _engine_done(call)
        if pending.strip() and not await _write(call, response, pending, idle):
            return response
    except (
        aiohttp.ClientPayloadError,
        aiohttp.ServerDisconnectedError,
        TimeoutError,
        ValueError,
    ) as exc:
        # the engine broke off mid-stream: tell the client in-band, the status is already sent
        fault: FailureKind | None = "timeout" if isinstance(exc, TimeoutError) else None
        raise _StreamBrokenError(
            response, f"the engine stream broke off: {type(exc).__name__}", fault
        ) from exc
    await _write(call, response, b"", idle, eof=True)
    return response


async def _after(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``first`` (when not empty), then the rest."""
    if first:
        yield first
    async for data in rest:
        yield data


def stream_error_event(message: str) -> bytes:
    """The in-band SSE event that ends a stream the engine broke off."""
    error: dict[str, Any] = {"error": {"message": message, "type": UPSTREAM, "code": STREAM_BROKEN}}
    return SSE_DATA + json.dumps(error).encode() + SSE_END


async def _end_stream_with_error(
    call: UpstreamCall, response: web.StreamResponse, message: str, idle: float
) -> None:
    """Write the error event and end the stream within ``idle`` seconds (ignoring a client
    already gone; cutting one that does not read)."""
    with contextlib.suppress(RuntimeError):
        if call.meter.client_gone:
            return
        await _write(call, response, stream_error_event(message), idle, eof=True)
