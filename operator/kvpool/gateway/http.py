"""The gateway's HTTP server: aiohttp's own errors in OpenAI JSON, slow clients cut off.

Why this module exists: a request that aiohttp itself refuses before any handler runs (a
malformed request line, an invalid header, a header too long) used to get aiohttp's
``text/plain`` 400, whose text quotes the offending bytes - for an invalid
``Authorization`` line, part of the API key. Here every such answer is the gateway's
OpenAI-format JSON with a generic message (nothing the client sent is echoed or logged),
and the connection is closed as before.

Slow clients: aiohttp closes a connection that has not delivered a complete request head
within its keep-alive timeout, counted from the connection (or the previous answer); the
gateway sets it to ``--header-timeout`` (10 s) instead of aiohttp's 3630 s, so half-sent
headers (slowloris) are dropped after that. The body has its own bound (``--body-timeout``,
enforced by the request handler).
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from kvpool.gateway.errors import SERVER, GatewayError

log = logging.getLogger("kvpool.gateway")


class _JsonErrorHandler(RequestHandler):
    """aiohttp's connection handler, answering its own errors as the gateway does."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # never log ``message``/``exc`` text: it can quote request bytes (an API key)
        log.info("malformed HTTP request answered %d (%s)", status, type(exc).__name__)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        if status >= 500:
            error = GatewayError(status, "internal_error", "internal gateway error", SERVER)
        else:
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = "Bad Request"
            error = GatewayError(status, "malformed_http", f"malformed HTTP request ({phrase})")
        response = error.response()
        response.force_close()
        return response


class _JsonErrorServer(web.Server):
    __slots__ = ()

    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """An AppRunner whose connections answer aiohttp-level errors in OpenAI JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _JsonErrorServer  # same layout; only __call__ differs
        return server
